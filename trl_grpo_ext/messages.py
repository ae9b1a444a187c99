"""The old path of `trl_grpo_ext.completion_text`, moved in issue #34 (the library core apart from the tools):
importing it warns once, a `FutureWarning` naming the new path, and gives the new module's names (the same objects)."""

import warnings

from .completion_text import *  # noqa: F403

warnings.warn(
    "trl_grpo_ext.messages moved to trl_grpo_ext.completion_text: import it from there (this old path "
    "will be removed)",
    FutureWarning,
    stacklevel=2,
)

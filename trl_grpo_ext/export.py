"""The old path of `trl_grpo_ext.cli.export`, moved in issue #34 (the library core apart from the tools): importing it
warns once, a `FutureWarning` naming the new path, and gives the new module's names (the same objects)."""

import warnings

from .cli.export import *  # noqa: F403

warnings.warn(
    "trl_grpo_ext.export moved to trl_grpo_ext.cli.export: import it from there (this old path will be removed)",
    FutureWarning,
    stacklevel=2,
)

"""The old path of `trl_grpo_ext.dataset_preparation`, moved in issue #34 (the library core apart from the tools):
importing it warns once, a `FutureWarning` naming the new path, and gives the new module's names (the same objects)."""

import warnings

from .dataset_preparation import *  # noqa: F403

warnings.warn(
    "trl_grpo_ext.dataset_checks moved to trl_grpo_ext.dataset_preparation: import it from there (this "
    "old path will be removed)",
    FutureWarning,
    stacklevel=2,
)

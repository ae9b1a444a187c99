"""The old path of `trl_grpo_ext.reporting.callbacks` and `trl_grpo_ext.reporting.plots`, moved in issue #34 (the
library core apart from the tools): importing it warns once, a `FutureWarning` naming the new path, and gives the
new module's names (the same objects)."""

import warnings

from .reporting.callbacks import *  # noqa: F403
from .reporting.plots import *  # noqa: F403

warnings.warn(
    "trl_grpo_ext.callbacks moved to trl_grpo_ext.reporting.callbacks and trl_grpo_ext.reporting.plots: "
    "import it from there (this old path will be removed)",
    FutureWarning,
    stacklevel=2,
)

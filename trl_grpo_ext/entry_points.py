"""The old path of `trl_grpo_ext.cli.errors`, moved in issue #34 (the library core apart from the tools): importing it
warns once, a `FutureWarning` naming the new path, and gives the new module's names (the same objects)."""

import warnings

from .cli.errors import *  # noqa: F403
from .command_name import cli_command  # noqa: F401 (it was here; the run doctor's messages use it)

warnings.warn(
    "trl_grpo_ext.entry_points moved to trl_grpo_ext.cli.errors: import it from there (this old path will be removed)",
    FutureWarning,
    stacklevel=2,
)

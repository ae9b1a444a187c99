"""Issue #34: a module moved out of the package's top level (into `cli/`, `reporting/`, or a name that says what it
holds) keeps its old import path: importing it warns once, a `FutureWarning` naming the new path, and gives the new
module's names, the same objects."""

import importlib
import sys
import warnings

import pytest

# old path -> (new module, a name it re-exports from there)
MOVED = {
    "trl_grpo_ext.callbacks": ("trl_grpo_ext.reporting.callbacks", "MetricsTableCallback"),
    "trl_grpo_ext.entry_points": ("trl_grpo_ext.cli.errors", "run"),
    "trl_grpo_ext.export": ("trl_grpo_ext.cli.export", "export_merged"),
    "trl_grpo_ext.messages": ("trl_grpo_ext.completion_text", "message_text"),
    "trl_grpo_ext.dataset_checks": ("trl_grpo_ext.dataset_preparation", "ROW_COLUMN"),
    "trl_grpo_ext.requirements": ("trl_grpo_ext.cli.optional_dependencies", "MissingDependencyError"),
    "trl_grpo_ext.tiny_model": ("trl_grpo_ext.cli.tiny_model", "save_tiny_model"),
}
# names that moved elsewhere than the module's main new home
ALSO = {
    "trl_grpo_ext.callbacks": ("trl_grpo_ext.reporting.plots", "plot_policy_groups"),
    "trl_grpo_ext.entry_points": ("trl_grpo_ext.command_name", "cli_command"),
}


def _fresh_import(name: str) -> tuple[object, list[warnings.WarningMessage]]:
    """Import `name` as a first import does (its module removed from `sys.modules` and from its package), recording
    every warning (pyproject's `filterwarnings` ignores FutureWarning, so the filter is reset here)."""
    sys.modules.pop(name, None)
    package, _, attribute = name.rpartition(".")
    if hasattr(sys.modules[package], attribute):
        delattr(sys.modules[package], attribute)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(name)
    return module, caught


@pytest.mark.parametrize("old", MOVED)
def test_an_old_module_path_warns_once_naming_the_new_one_and_gives_the_same_names(old):
    new, name = MOVED[old]
    target = importlib.import_module(new)  # imported first: only the shim's own warning is recorded below
    shim, caught = _fresh_import(old)
    future = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert len(future) == 1, [str(w.message) for w in caught]
    assert f"{old} moved to {new}" in str(future[0].message)
    assert getattr(shim, name) is getattr(target, name)
    if old in ALSO:
        elsewhere, other = ALSO[old]
        assert getattr(shim, other) is getattr(importlib.import_module(elsewhere), other)
    with warnings.catch_warnings(record=True) as again:  # a second import is the cached module: no second warning
        warnings.simplefilter("always")
        assert importlib.import_module(old) is shim
    assert not again


def test_the_command_line_package_keeps_the_console_script_and_its_names():
    """pyproject's `trl-grpo-ext = "trl_grpo_ext.cli:main"` and `from trl_grpo_ext import cli; cli.main(...)` work
    on the package `cli` as they did on the module `cli.py`."""
    from trl_grpo_ext import cli
    from trl_grpo_ext.cli import commands

    assert cli.main is commands.main and cli.COMMANDS is commands.COMMANDS and cli.USAGE == commands.USAGE
    assert set(cli.COMMANDS) == {"grpo", "tiny-model", "memory", "export", "doctor"}

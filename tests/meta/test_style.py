"""The code follows the project's lint rules (ruff, line length 119, E,F,I,W,UP,B: see pyproject.toml)."""

import importlib.util
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed")
def test_ruff_check_passes():
    cmd = [sys.executable, "-m", "ruff", "check", "--no-cache", "."]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_no_function_takes_more_than_five_positional_parameters():
    """Issue #61: a function of the package with more than 5 parameters (besides `self`/`cls`) takes the rest as
    keyword-only arguments, so that a call names what each value is (`prompt_keep_probability(history, rows,
    base=..., hopeless=...)`, not eleven values in a row)."""
    import ast

    crowded = []
    for path in sorted((REPO_ROOT / "trl_grpo_ext").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                positional = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
                if len(positional) > 5:
                    crowded.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name}({', '.join(positional)})")
    assert not crowded, "\n".join(crowded)

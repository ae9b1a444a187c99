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

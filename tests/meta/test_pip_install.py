"""scripts/pip_install.py: the set-up's installs go through uv with pip's settings carried over, or through pip."""

import importlib.util
import subprocess
import sys
import venv
import zipfile

from tests.conftest import REPO_ROOT


def _pip_install():
    spec = importlib.util.spec_from_file_location("pip_install", REPO_ROOT / "scripts" / "pip_install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LISTED = """\
:env:.disable-pip-version-check='1'
:env:.find-links='/env/wheels'
global.cert='/etc/ssl/certs/ca.crt'
global.constraint='/etc/pip/constraints.txt'
global.extra-index-url='file:///a/simple file:///b/simple'
global.find-links='/opt/wheels'
install.default-timeout='180'
"""


def test_pips_settings_become_uvs_options_the_environment_winning():
    pip_install = _pip_install()
    settings = pip_install.pip_settings(LISTED)
    # PIP_FIND_LINKS (":env:") wins over the config file's global.find-links, as in pip
    assert settings["find-links"] == "/env/wheels"
    command, env = pip_install.uv_command("uv", settings, "/venv/bin/python", True, ["-e", ".[test]"])
    assert command[:5] == ["uv", "pip", "install", "--quiet", "--python"]
    options = command[5:]
    for pair in (
        ["--index-strategy", "unsafe-best-match"],
        ["--find-links", "/env/wheels"],
        ["--constraint", "/etc/pip/constraints.txt"],
        ["--extra-index-url", "file:///a/simple", "--extra-index-url", "file:///b/simple"],
    ):
        assert any(options[i : i + len(pair)] == pair for i in range(len(options))), (pair, command)
    assert "/opt/wheels" not in command
    assert command[-3:] == ["--compile-bytecode", "-e", ".[test]"]
    assert env["SSL_CERT_FILE"] == "/etc/ssl/certs/ca.crt" and env["UV_HTTP_TIMEOUT"] == "180"
    command, _ = pip_install.uv_command("uv", {"no-index": "true"}, "py", False, ["six"])
    assert command[-2:] == ["--no-index", "six"]


def test_a_setting_uv_cannot_take_leaves_the_install_to_pip():
    pip_install = _pip_install()
    settings = pip_install.pip_settings(LISTED + "global.prefer-binary='1'\n")
    reason = pip_install.uv_command("uv", settings, "py", False, ["six"])
    assert reason == "pip's setting prefer-binary='1' has no counterpart here for uv"


def _wheel(folder):
    """A one-module wheel, tiny_pkg 1.0 (ANSWER = 42), written by hand: nothing to build, nothing to download."""
    path = folder / "tiny_pkg-1.0-py3-none-any.whl"
    files = {
        "tiny_pkg/__init__.py": "ANSWER = 42\n",
        "tiny_pkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: tiny-pkg\nVersion: 1.0\n",
        "tiny_pkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr("tiny_pkg-1.0.dist-info/RECORD", "".join(f"{name},,\n" for name in files) + "RECORD,,\n")
    return path


def test_without_uv_pip_installs_and_compiles(tmp_path):
    """In a Python where uv does not import, pip installs into a clean environment and --compile writes the byte
    code."""
    venv.create(tmp_path / "venv", with_pip=False)
    target = tmp_path / "venv" / "bin" / "python"
    without_uv = (
        "import runpy, sys; sys.modules['uv'] = None; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    script = REPO_ROOT / "scripts" / "pip_install.py"
    done = subprocess.run(
        [sys.executable, "-c", without_uv, str(script), str(target), "--compile", "--no-index", str(_wheel(tmp_path))],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "installing with pip (uv is not installed)" in done.stdout
    answer = subprocess.run([str(target), "-c", "import tiny_pkg; print(tiny_pkg.ANSWER)"], capture_output=True)
    assert answer.stdout.strip() == b"42"
    assert list((tmp_path / "venv").rglob("tiny_pkg/__pycache__/__init__.*.pyc"))

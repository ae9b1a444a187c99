"""`pip install` into another environment, through uv where it can: the set-up's and CI's installs.

    python scripts/pip_install.py TARGET_PYTHON [--compile] PIP_INSTALL_ARGS...

Run with the Python of an environment that has pip (and uv, where it was installed). Installs into the environment
of TARGET_PYTHON. --compile also writes the byte code of what it installs: where PYTHONDONTWRITEBYTECODE is set (this
project's machines) Python never writes what it compiles on import, so every process would compile torch and
transformers from source again (the test suite took twice as long).

uv (https://docs.astral.sh/uv/) installs the same releases as pip several times faster (torch 2.13's CPU wheel: 6 s
against 77 s on 2 cores), but reads none of pip's settings. They are carried over from `pip config list` (pip's
config files and PIP_* variables): the index, extra indexes, find-links, constraints, trusted hosts, certificate
and timeout, and uv resolves as pip does, the best version over all indexes (`--index-strategy unsafe-best-match`).
pip does the install instead, saying why, where uv is not installed in this Python's environment or where pip has a
setting this does not know how to carry over.
"""

import os
import shlex
import subprocess
import sys

# pip setting -> uv option; the value of a multi-valued setting is split on white space, one option per item
OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
FLAGS = {"no-index": "--no-index"}
ENVIRONMENT = {"cert": "SSL_CERT_FILE", "timeout": "UV_HTTP_TIMEOUT", "default-timeout": "UV_HTTP_TIMEOUT"}
# pip's output and prompts only: nothing that changes what gets installed
IGNORED = {"disable-pip-version-check", "no-input", "progress-bar", "quiet", "verbose", "root-user-action",
           "no-warn-script-location", "no-color", "cache-dir", "no-cache-dir"}  # fmt: skip
# where a setting is set twice, the later of these wins (pip: environment over the install section over global)
SECTIONS = ("global", "install", ":env:")


def pip_settings(listed: str) -> dict[str, str]:
    """pip's settings for `pip install` by name ("find-links"), from `pip config list`'s `section.name='value'`."""
    by_section: dict[str, dict[str, str]] = {section: {} for section in SECTIONS}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if section in by_section:
            by_section[section][name] = shlex.split(value)[0] if value.strip() else ""
    return {name: value for section in SECTIONS for name, value in by_section[section].items()}


def pip_config_list() -> str:
    command = [sys.executable, "-m", "pip", "config", "list"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def uv_command(
    uv: str, settings: dict[str, str], target: str, compile_: bool, args: list[str]
) -> tuple[list[str], dict[str, str]] | str:
    """The command and environment for the uv binary `uv` that install `args` into `target`'s environment with pip's
    `settings` (`pip_settings`), or why uv cannot."""
    command = [uv, "pip", "install", "--quiet", "--python", target, "--index-strategy", "unsafe-best-match"]
    env = dict(os.environ)
    for name, value in settings.items():
        if name in OPTIONS:
            command += [item for part in value.split() for item in (OPTIONS[name], part)]
        elif name in FLAGS:
            command += [FLAGS[name]] if value.lower() in ("1", "true", "yes", "on") else []
        elif name in ENVIRONMENT:
            env[ENVIRONMENT[name]] = value
        elif name not in IGNORED:
            return f"pip's setting {name}={value!r} has no counterpart here for uv"
    return command + (["--compile-bytecode"] if compile_ else []) + args, env


def main(argv: list[str]) -> int:
    target, *args = argv
    compile_ = "--compile" in args
    args = [arg for arg in args if arg != "--compile"]
    try:
        from uv import find_uv_bin

        uv = uv_command(find_uv_bin(), pip_settings(pip_config_list()), target, compile_, args)
    except ImportError:
        uv = "uv is not installed"
    if isinstance(uv, tuple):
        command, env = uv
        return subprocess.run(command, env=env).returncode
    print(f"pip_install: installing with pip ({uv})", flush=True)
    pip = [sys.executable, "-m", "pip", "--python", target, "install", "--quiet", "--disable-pip-version-check"]
    # pip byte-compiles what it installs one file after the other (torch alone ~45 s on 2 cores): without, then the
    # whole environment at once on every core (exit code 1 when a file does not compile: a few packages ship such
    # files, and pip skips them the same way)
    code = subprocess.run(pip + ["--no-compile"] + args).returncode
    if code == 0 and compile_:
        site = subprocess.run(
            [target, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        subprocess.run([target, "-m", "compileall", "-q", "-j", "0", site], stdout=subprocess.DEVNULL)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

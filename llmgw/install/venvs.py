"""The venv a release is installed into (`llmgw node add`, `server add`, `server upgrade`, an agent's upgrade):
`venv_commands(path)` says how to make it, `make_venv(path)` makes it.

`python3 -m venv DIR` runs ensurepip, which installs pip and setuptools from the wheels that come with Python
(Debian: /usr/share/python-wheels, python3-pip-whl) and compiles every module of both: about 3.3 s of CPU, most of
making the venv. A release needs pip only (its wheels are installed offline; nothing is built from source, so no
setuptools: Python 3.12's venv leaves it out as well), so the venv is made `--without-pip`, then pip is installed
into it from the very wheel ensurepip would have used, pip run from that wheel itself, without compiling (its
modules are compiled when the venv's pip first imports them): about 1.8 s. pip runs as ensurepip runs it, without
PIP_* variables and configuration files. Where that wheel cannot be found (a Python whose ensurepip keeps it
elsewhere) or either step fails, the venv is removed and made with plain `python3 -m venv DIR`, whose failure (no
ensurepip: Debian's python3-venv missing) is the one reported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

Runner = Callable[[Sequence[str], dict[str, str]], subprocess.CompletedProcess]
"""Runs an argv with an environment and returns it completed, output captured."""


def pip_wheel(python_ensurepip=None) -> Path | None:
    """The pip wheel `python -m ensurepip` installs from (the module `python_ensurepip`, default this Python's
    ensurepip), or None where it cannot be told: ensurepip missing, its private helpers changed, no such file."""
    try:
        ensurepip = python_ensurepip
        if ensurepip is None:
            import ensurepip
        if hasattr(ensurepip, "_get_packages"):  # Python 3.11 and 3.12
            package = ensurepip._get_packages()["pip"]
            if package.wheel_path:
                wheel = Path(package.wheel_path)
            else:
                wheel = Path(ensurepip.__file__).parent / "_bundled" / package.wheel_name
        elif hasattr(ensurepip, "_get_pip_whl_path_ctx"):  # Python 3.13 and later
            with ensurepip._get_pip_whl_path_ctx() as found:  # a real file stays after; a temporary one does not
                wheel = Path(found)
        else:
            return None
    except Exception:  # noqa: BLE001 - private helpers of another version: plain `python3 -m venv`
        return None
    return wheel if wheel is not None and wheel.name.startswith("pip-") and wheel.is_file() else None


def venv_commands(path: Path, python: str = sys.executable, wheel: Path | None = None) -> list[list[str]]:
    """The commands that make the venv `path` with `python` and pip from `wheel` (module docstring); with no
    wheel, plain `python -m venv` (which bootstraps pip with ensurepip)."""
    if wheel is None:
        return [[python, "-m", "venv", str(path)]]
    return [[python, "-m", "venv", "--without-pip", str(path)],
            [str(path / "bin" / "python"), f"{wheel}/pip", "install", "--no-compile", "--no-index", "--no-cache-dir",
             "--disable-pip-version-check", "--quiet", str(wheel)]]


def pip_environment() -> dict[str, str]:
    """This process's environment as ensurepip gives pip: no PIP_* variables, no configuration files."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}


def _run(argv: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=600)


def make_venv(path: Path, run: Runner = _run, wheel: Path | None = None) -> subprocess.CompletedProcess:
    """Make the venv `path` (module docstring) with this Python; `wheel` overrides `pip_wheel()`. Returns the last
    command completed: a returncode other than 0 is plain `python3 -m venv`'s failure (`path` may be left
    half-made). Raises OSError or TimeoutExpired as `run` does."""
    wheel = wheel or pip_wheel()
    if wheel is not None:
        env = pip_environment()
        for argv in venv_commands(path, wheel=wheel):
            done = run(argv, env)
            if done.returncode:
                break
        else:
            return done
        shutil.rmtree(path, ignore_errors=True)
    return run(venv_commands(path)[0], dict(os.environ))

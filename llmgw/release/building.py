"""`build_release`: a release directory of llmgw's wheel, the wheels it depends on for one Python and platform, and
a signed manifest, so that a node installs llmgw with `pip install --no-index --find-links wheels/ llmgw` and
no registry.

Steps: copy the source tree (a git checkout: the files git tracks or would track, so no build output or virtual
environment travels; its commit and whether it had changes are recorded), `pip wheel --no-deps
--no-build-isolation` it, then `pip download --only-binary=:all: --python-version X --implementation cp
--platform ...` the wheel's dependencies for the target, pinned by the checkout's constraints.txt, into wheels/
(from pip's cache when it has them, else from the index pip is configured with), then write and sign the manifest.
Measured here: 1.5 s for llmgw's wheel, 6 s for its 53 dependency wheels (35 MB) from pip's cache.

pip: `pip wheel` and `pip download` of pip 23 (https://pip.pypa.io/en/stable/cli/pip_download/); a manylinux_2_Y
platform is given to pip with every older manylinux tag too (`target_platforms`), as pip 23 does not widen it itself.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from llmgw.errors import ReleaseError
from llmgw.release.keys import SecretKey, read_secret_key
from llmgw.release.manifest import MANIFEST, Manifest, describe, release_files, write_signed_manifest

DEFAULT_PYTHON = "3.11"
DEFAULT_PLATFORM = "manylinux_2_28_x86_64"
"""glibc 2.28 and newer on x86-64: Debian 10+, Ubuntu 18.10+, RHEL 8+."""
PIP_TIMEOUT = 1800.0
"""Seconds one pip command may take (a first download of every dependency over a slow link)."""
_MANYLINUX = re.compile(r"^manylinux_2_(\d+)_([a-z0-9_]+)$")
_LEGACY = ((17, "manylinux2014"), (12, "manylinux2010"), (5, "manylinux1"))
_SKIP = shutil.ignore_patterns(".git", ".venv", ".state", "build", "dist", "*.egg-info", "__pycache__", "*.pyc")

Progress = Callable[[str], None]


def target_platforms(platform: str) -> list[str]:
    """pip's `--platform` values for a target: manylinux_2_28_x86_64 -> manylinux_2_28_x86_64, ..._2_27_..., down to
    manylinux_2_5_x86_64, then manylinux2014_x86_64, manylinux2010_x86_64, manylinux1_x86_64 (every wheel that runs
    on glibc 2.28). Any other platform tag (macosx_..., linux_aarch64) is passed as it is."""
    match = _MANYLINUX.match(platform)
    if not match:
        return [platform]
    glibc, arch = int(match.group(1)), match.group(2)
    return ([f"manylinux_2_{minor}_{arch}" for minor in range(glibc, 4, -1)]
            + [f"{legacy}_{arch}" for since, legacy in _LEGACY if glibc >= since])


def default_source() -> Path | None:
    """The source checkout this llmgw runs from (its pyproject.toml names llmgw), or None when it runs installed."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and re.search(r'(?m)^name = "llmgw"$', pyproject.read_text()):
        return root
    return None


def _git(source: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, check=True,
                          timeout=60).stdout


def _copy_source(source: Path, target: Path) -> tuple[str | None, bool]:
    """Copy the files of checkout `source` to `target`; returns (git commit or None, had uncommitted changes)."""
    if not (source / ".git").exists():
        shutil.copytree(source, target, ignore=_SKIP)
        return None, False
    try:
        names = _git(source, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
        commit = _git(source, "rev-parse", "HEAD").strip()
        dirty = bool(_git(source, "status", "--porcelain", "--untracked-files=no").strip())
    except (OSError, subprocess.SubprocessError) as exc:
        raise ReleaseError(f"cannot list the files of the checkout {source} with git: {exc}") from exc
    for name in filter(None, names):
        path = source / name
        if path.is_file():  # a tracked file deleted in the work tree is left out, as the build would leave it
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / name, follow_symlinks=False)
    return commit, dirty


def _pip(args: list[str], what: str) -> None:
    command = [sys.executable, "-m", "pip", *args]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ReleaseError(f"{what} failed: {exc}") from exc
    if done.returncode != 0:
        said = "\n".join(line for line in (done.stderr + done.stdout).splitlines()
                         if line.strip() and "is ignored: it is neither a file nor a directory" not in line)
        raise ReleaseError(f"{what} failed (pip exit {done.returncode}):\n{said[-3000:]}")


def _check_target(python: str, platform: str) -> None:
    if not re.fullmatch(r"3\.\d{1,2}", python):
        raise ReleaseError(f"python {python!r} is not a Python version such as 3.11")
    if int(python.split(".")[1]) < 11:
        raise ReleaseError(f"llmgw needs Python 3.11 or newer: python {python} cannot run it")
    if not re.fullmatch(r"[a-z0-9_]+", platform):
        raise ReleaseError(f"platform {platform!r} is not a wheel platform tag such as {DEFAULT_PLATFORM}")


def _fresh_directory(out_dir: Path) -> bool:
    """Make `out_dir` (True) or accept it empty (False). Raises: ReleaseError when it holds anything."""
    if out_dir.exists():
        if not out_dir.is_dir() or any(out_dir.iterdir()):
            raise ReleaseError(f"{out_dir} exists and is not an empty directory: build a release into a new one")
        return False
    out_dir.mkdir(parents=True)
    return True


def build_release(out_dir: Path | str, secret_key: Path | str | SecretKey, python: str = DEFAULT_PYTHON,
                  platform: str = DEFAULT_PLATFORM, *, passphrase: str | None = None, dependencies: bool = True,
                  source: Path | str | None = None, constraints: Path | str | None = None,
                  progress: Progress | None = None) -> Path:
    """Build a signed release of the llmgw checkout `source` (default: the one this llmgw runs from) into `out_dir`
    (made; or empty) and return `out_dir`.

    It holds wheels/ (llmgw's wheel and, unless `dependencies` is False, every wheel it depends on for CPython
    `python` on `platform`, resolved under `constraints`: default the checkout's constraints.txt), manifest.json and
    manifest.json.minisig (signed with `secret_key`, a path to a minisign secret key decrypted with `passphrase`, or
    a SecretKey). `progress` is told each step in words. Blocks (runs pip): seconds, longer on a first download.
    Raises: ReleaseError saying what failed (a key that does not open, a bad target, no checkout, pip's own
    words); `out_dir` is removed again when it was made here.
    """
    out_dir = Path(out_dir)
    say = progress or (lambda _: None)
    _check_target(python, platform)
    key = secret_key if isinstance(secret_key, SecretKey) else read_secret_key(secret_key, passphrase)
    source = Path(source) if source is not None else default_source()
    if source is None or not (source / "pyproject.toml").is_file():
        raise ReleaseError("llmgw runs installed, not from a checkout: pass the source checkout to build from "
                           "(--source DIR)")
    constraints = Path(constraints) if constraints is not None else source / "constraints.txt"
    made = _fresh_directory(out_dir)
    try:
        with tempfile.TemporaryDirectory(prefix="llmgw-release-") as scratch:
            work = Path(scratch) / "llmgw-checkout"  # not "src": setuptools then fails to build (seen with 84.2)
            commit, dirty = _copy_source(source, work)
            say(f"building llmgw's wheel from {source}" + (f" at {commit[:12]}" if commit else "")
                + (" (with changes not committed)" if dirty else ""))
            _pip(["wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(Path(scratch) / "dist"),
                  str(work)], "building llmgw's wheel")
            [wheel] = (Path(scratch) / "dist").glob("llmgw-*.whl")
            wheels = out_dir / "wheels"
            wheels.mkdir()
            if dependencies:
                say(f"downloading its dependencies for Python {python} on {platform}")
                args = ["download", "--quiet", "--only-binary=:all:", "--python-version", python, "--implementation",
                        "cp", *[arg for tag in target_platforms(platform) for arg in ("--platform", tag)],
                        "-d", str(wheels)]
                if constraints.is_file():
                    args += ["-c", str(constraints)]
                _pip([*args, str(wheel)], f"downloading llmgw's dependencies for Python {python} on {platform}")
            else:
                shutil.copy2(wheel, wheels / wheel.name)
        version = wheel.name.split("-")[1]
        say(f"writing and signing {MANIFEST} with key {key.id_text}")
        now = time.time()
        manifest = Manifest(name="llmgw", version=version,
                            created=datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                            python=python, platform=platform, files=describe(out_dir, release_files(out_dir)),
                            source_commit=commit, dirty=dirty)
        write_signed_manifest(out_dir, manifest, key, f"timestamp:{int(now)}\tfile:{MANIFEST}\thashed\t"
                                                      f"llmgw {version} for python {python} on {platform}")
    except BaseException:
        if made:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    return out_dir

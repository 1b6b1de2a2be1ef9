"""Executables standing in for the tools and engines a test cannot run here (ib_write_bw, vllm, llama-server): a
shell wrapper that runs one of the Python stand-ins of tests/support with this interpreter."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def python_tool(path: Path, script: Path) -> Path:
    """Write an executable `path` (its directory created) that runs `script` with this interpreter and the
    arguments it is given, unbuffered (its output reaches a log as it is written); returns `path`. Put its directory
    on PATH to stand in for a tool found there, or give the path itself (`engine_binaries`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nPYTHONUNBUFFERED=1 exec {shlex.quote(sys.executable)} {shlex.quote(str(script))} "
                    '"$@"\n')
    path.chmod(0o755)
    return path

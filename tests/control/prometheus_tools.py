"""The real Prometheus tools the observability tests run: promtool and prometheus from Debian's `prometheus`
package (the Makefile's `venv` target installs it). Absent, a test fails loudly naming the package; it never skips.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def require(tool: str) -> str:
    """The path of `tool`; fails the test (never skips) when it is not installed."""
    found = shutil.which(tool)
    if found is None:
        pytest.fail(f"{tool} is not installed: `apt-get install prometheus` (Debian; `make venv` does it) provides "
                    f"promtool and prometheus, which these tests need", pytrace=False)
    return found


def promtool(*args: str, stdin: bytes | None = None) -> str:
    """Run promtool with `args`; return its output, or fail the test with it when promtool exits non-zero."""
    done = subprocess.run([require("promtool"), *args], input=stdin, capture_output=True, timeout=60)
    output = (done.stdout + done.stderr).decode()
    if done.returncode:
        pytest.fail(f"promtool {' '.join(args)} failed:\n{output}", pytrace=False)
    return output

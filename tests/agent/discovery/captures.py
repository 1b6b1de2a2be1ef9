"""The real H200 captures (with their `# $ command` / `# exit=N` lines stripped) and the variants in ./fixtures
written for other driver generations from FORMATS.md."""

from __future__ import annotations

from pathlib import Path

from fake_nvml import FIXTURES

VARIANTS = Path(__file__).parent / "fixtures"


def capture(name: str) -> str:
    """A shared H200 capture without its first ("# $ ...") and last ("# exit=N") lines."""
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    if lines and lines[0].startswith("# $"):
        lines = lines[1:]
    if lines and lines[-1].startswith("# exit="):
        lines = lines[:-1]
    return "".join(lines)


def variant(name: str) -> str:
    """A variant written here (no capture header)."""
    return (VARIANTS / name).read_text()

"""Reading the captures in tests/fixtures/ (sources: tests/fixtures/README.md) for the tests of llmgw.tools."""

from __future__ import annotations

from pathlib import Path

from llmgw.tools import command_body

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def fixture(path: str) -> str:
    """The text of tests/fixtures/<path>, with a capture's "# $ command" / "# exit=N" frame removed."""
    return command_body((FIXTURES / path).read_text())


def h200_xml() -> str:
    """The real H200's `nvidia-smi -q -x` at idle (driver 580, DTD v13)."""
    return fixture("nvidia-h200/nvidia-smi-q-x.xml")


def h200_variant(*replacements: tuple[str, str]) -> str:
    """A hand-made variant of the H200 capture: each (old, new) replaced exactly once; fails loudly if `old` is
    not in the capture exactly once, so a variant never silently stops testing what it names."""
    text = h200_xml()
    for old, new in replacements:
        assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in the H200 capture"
        text = text.replace(old, new)
    return text

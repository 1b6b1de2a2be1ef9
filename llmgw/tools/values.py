"""Reading one value out of a tool's text: placeholders, units and counts, shared by the parsers of `llmgw.tools`;
and `ParseError`, the one error those parsers raise.

nvidia-smi writes "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]", "[Insufficient
Permissions]" and "Requested functionality has been deprecated" where a number would be (FORMATS.md, driver
515-580 captures); each of those reads as None here, never 0. Numbers carry units: "143771 MiB", "123.63 W",
"37 C", "1980 MHz", "16x", "0 %".
"""

from __future__ import annotations

import re

from llmgw.errors import LlmgwError


class ParseError(LlmgwError):
    """A tool's output is not in the format its parser knows. `tool` names the command ("sminfo"), `line` is the
    1-based line the parser stopped at (0: the whole text), `text` that line (or the text's start), cut to 200
    characters. `str()` says all three. A parser raises only this (or returns data), whatever its input."""

    def __init__(self, tool: str, message: str, line: int = 0, text: str = ""):
        self.tool = tool
        self.line = line
        self.text = text[:200]
        where = f" (line {line}: {self.text!r})" if line else (f" (it began {self.text[:80]!r})" if text else "")
        super().__init__(f"{tool}: {message}{where}")

_NUMBER_RE = re.compile(r"^\s*\[?\s*(-?[0-9]+(?:\.[0-9]+)?)\s*([A-Za-z%/]*)\s*\]?\s*$")
_UNIT_BYTES = {
    "": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3,
}


def is_placeholder(text: str | None) -> bool:
    """True when `text` is empty or one of the tool's "no value" words (with or without brackets)."""
    if text is None:
        return True
    word = text.strip().strip("[]").strip().lower()
    return word in ("", "n/a", "na", "none", "not supported", "unknown error", "insufficient permissions",
                    "requested functionality has been deprecated", "gpu requires reset", "not available")


def number(text: str | None) -> float | None:
    """The number at the start of `text` ("123.63 W" -> 123.63, "16x" -> 16.0); None for placeholders or garbage."""
    if is_placeholder(text):
        return None
    match = _NUMBER_RE.match(text or "")
    return float(match.group(1)) if match else None


def integer(text: str | None) -> int | None:
    """`number(text)` as an int when it is whole; None otherwise."""
    value = number(text)
    return int(value) if value is not None and value == int(value) else None


def size_bytes(text: str | None) -> int | None:
    """A memory size in bytes from "143771 MiB" (nvidia-smi prints MiB) or a bare number of bytes; None if absent."""
    if is_placeholder(text):
        return None
    match = _NUMBER_RE.match(text or "")
    if not match:
        return None
    factor = _UNIT_BYTES.get(match.group(2).lower())
    if factor is None:
        return None
    return int(float(match.group(1)) * factor)


def enabled(text: str | None) -> bool | None:
    """"Enabled"/"Yes"/"Active" -> True, "Disabled"/"No"/"Not Active" -> False, anything else None."""
    if text is None:
        return None
    word = text.strip().lower()
    if word in ("enabled", "yes", "active", "on", "true"):
        return True
    if word in ("disabled", "no", "not active", "off", "false"):
        return False
    return None


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (nvidia-smi underlines the `topo -m` header even when writing to a file)."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def command_body(text: str) -> str:
    """`text` without a leading "# $ command" line and a trailing "# exit=N" line, the frame of the captures in
    tests/fixtures/nvidia-h200/ and of `llmgw node doctor --from` directories; other text is returned unchanged."""
    lines = text.splitlines(keepends=True)
    if lines and lines[0].startswith("# $"):
        lines = lines[1:]
    if lines and lines[-1].startswith("# exit="):
        lines = lines[:-1]
    return "".join(lines)

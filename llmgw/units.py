"""Parsing and printing of sizes and durations as written in settings.

Sizes follow Kubernetes' quantity suffixes (https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/):
binary `Ki Mi Gi Ti Pi` (powers of 1024) and decimal `k K M G T P` (powers of 1000), an optional trailing `B`
(`16GiB`), and fractions (`1.5T`). A bare integer is bytes. Durations are a number followed by `ms`, `s`, `m`,
`h` or `d` (`500ms`, `2s`, `5m`, `1.5h`); a bare number is seconds.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

SIZE_PATTERN = r"^[0-9]+(\.[0-9]+)?([kKMGTP]i?|Ki)?B?$"
DURATION_PATTERN = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h|d)$"

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kKMGTP]i?|Ki)?B?\s*$")
_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*$")

_SIZE_FACTORS = {
    None: 1,
    "k": 1000, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4, "P": 1000**5,
    "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5,
}
_DURATION_FACTORS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_size(value: str | int) -> int:
    """Return a size in bytes from `value` ("512Mi", "16Gi", "1.5T", "16GiB" or an int of bytes).

    Fractional results are rounded down to whole bytes. Raises ValueError with the offending text when
    the value is not a size (negative numbers are not sizes).
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is not a size: sizes are not negative")
        return value
    match = _SIZE_RE.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a size (write e.g. 512Mi, 16Gi or 1.5T)")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"{value!r} is not a size") from exc
    return int(number * _SIZE_FACTORS[match.group(2)])


def parse_duration(value: str | int | float) -> float:
    """Return a duration in seconds from `value` ("500ms", "2s", "5m", "1.5h", "1d" or a number of seconds).

    Raises ValueError with the offending text when the value is not a duration.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{value} is not a duration: durations are not negative")
        return float(value)
    match = _DURATION_RE.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration (write e.g. 500ms, 2s or 5m)")
    return float(Decimal(match.group(1)) * Decimal(str(_DURATION_FACTORS[match.group(2)])))


def format_size(size_bytes: int) -> str:
    """Return `size_bytes` in the largest binary unit that keeps it readable: 1536 -> "1.5Ki", 17179869184 -> "16Gi"."""
    value = float(size_bytes)
    for unit in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(value) < 1024 or unit == "Ti":
            text = f"{value:.1f}".rstrip("0").rstrip(".")
            return f"{text}{unit}" if unit else f"{int(size_bytes)}"
        value /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """Return `seconds` as a short duration: 0.5 -> "500ms", 90 -> "1m30s", 7200 -> "2h"."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    whole = int(round(seconds))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts) or "0s"

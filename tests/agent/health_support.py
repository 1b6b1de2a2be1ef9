"""Tool runners for the agent's health readings, built on the real H200 captures (tests/fixtures/nvidia-h200).

`two_h200_xml()` is a variant made here: the H200's `nvidia-smi -q -x` with its one `<gpu>` repeated for a second
card that has the UUID and PCI address of `nvml_support.two_h200s()`'s second card.
"""

from __future__ import annotations

from collections.abc import Callable

import nvml_support  # noqa: F401  (puts tests/agent/discovery on the path)
from llmgw.agent.discovery import ToolOutput

from captures import capture  # noqa: E402

FIRST_BUS = "00000000:00:06.0"
SECOND_BUS = "00000000:00:07.0"
SECOND_UUID = "GPU-11111111-2222-3333-4444-555555555555"
FIRST_UUID = "GPU-050bda45-960a-207c-573e-20129c535d06"
XID_79_SECOND = ("2026-11-24T12:00:09+00:00 gpu-node kernel: NVRM: Xid (PCI:0000:00:07): 79, pid='<unknown>', "
                 "name=<unknown>, GPU has fallen off the bus.")


def two_h200_xml() -> str:
    text = capture("nvidia-smi-q-x.xml")
    start, end = text.index("<gpu id="), text.index("</gpu>") + len("</gpu>")
    second = text[start:end].replace(FIRST_UUID, SECOND_UUID).replace(FIRST_BUS, SECOND_BUS)
    second = second.replace('<gpu id="00000000:00:06.0">', f'<gpu id="{SECOND_BUS}">')
    return text[:end] + "\n" + second + text[end:]


class Tools:
    """A runner answering nvidia-smi with `xml`, `nvidia-smi nvlink -e` with the next of `nvlink` (else the H200's
    empty capture) and journalctl with the next of `journal` (each a text printed
    with a cursor line "-- cursor: c<n>"), recording every argv. A program in `missing` is not installed."""

    def __init__(self, xml: str | None = None, journal: list[str] | None = None, missing: tuple[str, ...] = (),
                 dmesg: list[str] | None = None, nvlink: list[str] | None = None):
        self.xml = two_h200_xml() if xml is None else xml
        self.nvlink = list(nvlink or [])
        self.journal = list(journal or [])
        self.dmesg = list(dmesg or [])
        self.missing = missing
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> ToolOutput | None:
        self.calls.append(list(argv))
        if argv[0] in self.missing:
            return None
        if argv[:3] == ["nvidia-smi", "nvlink", "-e"]:  # the H200 has no NVLink: it prints nothing
            return ToolOutput(tuple(argv), 0, self.nvlink.pop(0) if self.nvlink else capture("nvidia-smi-nvlink-e.txt"))
        if argv[0] == "nvidia-smi":
            return ToolOutput(tuple(argv), 0, self.xml)
        if argv[0] == "journalctl":
            n = sum(call[0] == "journalctl" for call in self.calls)
            text = self.journal.pop(0) if self.journal else ""
            cursor = f"\n-- cursor: c{n}" if text else "-- No entries --"
            return ToolOutput(tuple(argv), 0, text + cursor)
        if argv[0] == "dmesg":
            return ToolOutput(tuple(argv), 0, self.dmesg.pop(0) if self.dmesg else "")
        return None


def counting_clock() -> tuple[Callable[[], float], Callable[[float], None]]:
    """(clock, advance): a monotonic clock for `HealthReader` that moves only when told."""
    now = [1000.0]

    def advance(seconds: float) -> None:
        now[0] += seconds

    return (lambda: now[0]), advance

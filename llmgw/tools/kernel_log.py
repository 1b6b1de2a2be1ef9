"""NVIDIA XIDs in the kernel log, attributed to a card by PCI address. Pure parser.

The driver writes one line per event: `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off
the bus.` The `pid=..., name=...,` part is missing on older drivers and reads `pid='<unknown>', name=<unknown>` when
no process is involved; the message after it is free text. The line arrives with one of these prefixes:

- `dmesg`: "[  171.620236] NVRM: ..." (seconds since boot) or, with `dmesg -T`, "[Sun Feb 23 16:24:18 2025] NVRM: ..."
- `/dev/kmsg`: "4,3964,206764307,-;NVRM: ..." (priority, sequence, microseconds since boot, flags; kernel
  Documentation/ABI/testing/dev-kmsg), continuation lines start with a space and are ignored;
- `journalctl -k`: "Feb 14 05:03:41 host kernel: NVRM: ..." (syslog short format, also /var/log/syslog).

The GPU that fell off the bus may instead be announced without an Xid, over three lines ("NVRM: The NVIDIA GPU
0000:b3:00.0 ... NVRM: fallen off the bus and is not responding to commands."); that reads as Xid 79 with
`from_text=True` (NVIDIA/NVSentinel#155, leptonai/gpud#1209).

Captures: tests/fixtures/nvidia-h200/dmesg-xid.txt (a healthy H200: NVRM lines, no Xid) and
tests/fixtures/kernel-log/ (public captures, sources in its README.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-9A-Fa-f])?\):\s*"
    r"(?P<xid>[0-9]+)\s*(?:,\s*(?P<rest>.*))?$")
_PID = re.compile(r"^pid=(?P<pid>'?<unknown>'?|[0-9]+)\s*,\s*(?:name=(?P<name>.*?)\s*,\s*)?(?P<msg>.*)$")
_DMESG = re.compile(r"^\[\s*(?P<ts>[^\]]+)\]\s*")
_KMSG = re.compile(r"^(?P<prio>[0-9]+),(?P<seq>[0-9]+),(?P<usec>[0-9]+),[^;]*;")
_SYSLOG = re.compile(r"^(?P<ts>[A-Z][a-z]{2} [ 0-9][0-9] [0-9:]{8}|[0-9]{4}-[0-9]{2}-[0-9]{2}T[^ ]+) \S+ kernel: ")
_OFF_BUS_GPU = re.compile(r"NVRM: The NVIDIA GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\.[0-9A-Fa-f]")
_OFF_BUS_TEXT = re.compile(r"fallen off the bus")


@dataclass(frozen=True)
class XidEvent:
    """One XID: `pci_bus_id` the card, normalised to nvidia-smi's form "00000000:3B:00.0" (8-digit domain, upper
    case, function 0) so it matches `nvidia-smi -q -x`'s `pci_bus_id`; `xid` the number; `pid` and `process` when
    the driver named them (None / "" otherwise); `message` the text after them; `timestamp` as the log printed it
    ("171.620236", "Sun Feb 23 16:24:18 2025", "Feb 14 05:03:41"; for /dev/kmsg the microseconds since boot;
    "" when absent); `line` the whole log line, for the operator; `from_text` True for an Xid 79 read from the
    fallen-off-the-bus message rather than an Xid line."""

    pci_bus_id: str
    xid: int
    message: str
    pid: int | None = None
    process: str = ""
    timestamp: str = ""
    line: str = ""
    from_text: bool = False


def normalise_bus_id(bus: str) -> str:
    """"0000:3b:00" or "00000000:3B:00.0" -> "00000000:3B:00.0": the form nvidia-smi -q -x prints for a card."""
    head, _, function = bus.partition(".")
    parts = head.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    domain, bus_no, device = parts[-3:]
    return f"{int(domain, 16):08X}:{bus_no.upper()}:{device.upper()}.{(function or '0').upper()}"


def _strip_prefix(line: str) -> tuple[str, str]:
    """(timestamp, text after the log prefix) for the dmesg, /dev/kmsg and syslog forms."""
    match = _KMSG.match(line)
    if match:
        return match.group("usec"), line[match.end():]
    match = _SYSLOG.match(line)
    if match:
        rest = line[match.end():]
        inner = _DMESG.match(rest)  # journalctl -k --output=short-monotonic adds "[  12.3]" after the host
        return match.group("ts"), rest[inner.end():] if inner else rest
    match = _DMESG.match(line)
    if match:
        return match.group("ts").strip(), line[match.end():]
    return "", line


def parse_xids(text: str) -> tuple[XidEvent, ...]:
    """Every XID in `text` (dmesg, /dev/kmsg or journalctl -k output; other lines are skipped), in log order.

    Never raises: a kernel log holds every driver's lines, so a line that does not match is not an error. An
    "NVRM: Xid" line whose number cannot be read is skipped too (the driver's format is the only source).
    """
    events: list[XidEvent] = []
    off_bus: str | None = None
    off_bus_ts = ""
    off_bus_line = ""
    for raw in text.splitlines():
        if raw.startswith((" ", "\t")) and not raw.strip().startswith(("[", "NVRM")):
            continue  # a /dev/kmsg continuation ("  SUBSYSTEM=pci")
        timestamp, body = _strip_prefix(raw.rstrip())
        match = _XID.search(body)
        if match:
            rest = (match.group("rest") or "").strip()
            pid: int | None = None
            process = ""
            who = _PID.match(rest)
            if who:
                pid = int(who.group("pid")) if who.group("pid").isdigit() else None
                name = who.group("name") or ""
                process = "" if "<unknown>" in name else name
                rest = who.group("msg")
            events.append(XidEvent(normalise_bus_id(match.group("bus")), int(match.group("xid")), rest, pid,
                                   process, timestamp, raw.strip()))
            continue
        match = _OFF_BUS_GPU.search(body)
        if match:
            off_bus, off_bus_ts, off_bus_line = normalise_bus_id(match.group("bus") + ".0"), timestamp, raw.strip()
            if _OFF_BUS_TEXT.search(body):
                events.append(XidEvent(off_bus, 79, "GPU has fallen off the bus", None, "", timestamp,
                                       raw.strip(), from_text=True))
                off_bus = None
            continue
        if off_bus is not None and "NVRM:" in body:
            if _OFF_BUS_TEXT.search(body):
                already = any(e.xid == 79 and e.pci_bus_id == off_bus for e in events[-3:])
                if not already:
                    events.append(XidEvent(off_bus, 79, "GPU has fallen off the bus", None, "", off_bus_ts,
                                           off_bus_line, from_text=True))
                off_bus = None
            elif "(PCI ID:" not in body and "installed in this system" not in body:
                off_bus = None
    return tuple(events)

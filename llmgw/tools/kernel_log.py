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

The kernel also says, once per device at boot, what PCIe bandwidth a device gets against what it could
(drivers/pci/pci.c, `__pcie_print_link_status`): "pci 0000:04:00.0: 252.048 Gb/s available PCIe bandwidth,
limited by 16.0 GT/s PCIe x16 link at 0000:01:00.0 (capable of 504.112 Gb/s with 32.0 GT/s PCIe x16 link)";
older kernels write "16 GT/s" without "PCIe", newer ones may end in ", in Flit mode". `parse_pcie_bandwidth`
reads those lines: they name a slow slot or switch even while the card idles.

Captures: tests/fixtures/nvidia-h200/dmesg-xid.txt (a healthy H200: NVRM lines, no Xid), gpud/ and
ml-engineering/ (public captures; sources in tests/fixtures/README.md) and hand-made/kernel-log-journalctl.txt.
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
_LINK = r"(?P<{0}speed>[0-9.]+|Unknown) GT/s(?: PCIe)? x(?P<{0}width>[0-9]+) link"
_PCIE_BW = re.compile(
    r"(?P<bus>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]): (?P<avail>[0-9]+\.[0-9]+) Gb/s "
    r"available PCIe bandwidth(?:, limited by " + _LINK.format("") + r" at (?P<at>\S+) \(capable of "
    r"(?P<cap>[0-9]+\.[0-9]+) Gb/s with " + _LINK.format("cap_") + r"\)| \(" + _LINK.format("full_") + r"\))")
# PCIe generation by transfer rate in GT/s.
GENERATION_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


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


@dataclass(frozen=True)
class PcieBandwidthNote:
    """The kernel's boot-time note on a PCIe device's bandwidth. `pci_bus_id` normalised as in `XidEvent`;
    `available_gbps` / `capable_gbps` in Gb/s as printed; `gen` / `width` the link that limits it (the device's own
    when not limited), `capable_gen` / `capable_width` what the device could do; `limited_at` the device whose link
    limits it ("0000:01:00.0", "<unknown>"; "" when not limited); `line` the log line."""

    pci_bus_id: str
    available_gbps: float
    capable_gbps: float
    gen: int | None
    width: int
    capable_gen: int | None
    capable_width: int
    limited_at: str = ""
    line: str = ""

    @property
    def limited(self) -> bool:
        return self.available_gbps < self.capable_gbps


def _gen(speed: str) -> int | None:
    try:
        return GENERATION_BY_GTS.get(float(speed))
    except ValueError:
        return None


def parse_pcie_bandwidth(text: str) -> tuple[PcieBandwidthNote, ...]:
    """Every "Gb/s available PCIe bandwidth" line in a kernel log (any of the forms `parse_xids` reads), in order;
    other lines are skipped. Never raises."""
    notes = []
    for raw in text.splitlines():
        match = _PCIE_BW.search(raw)
        if not match:
            continue
        bus = normalise_bus_id(match.group("bus"))
        avail = float(match.group("avail"))
        if match.group("full_speed") is not None:
            gen, width = _gen(match.group("full_speed")), int(match.group("full_width"))
            notes.append(PcieBandwidthNote(bus, avail, avail, gen, width, gen, width, "", raw.strip()))
            continue
        notes.append(PcieBandwidthNote(
            bus, avail, float(match.group("cap")), _gen(match.group("speed")), int(match.group("width")),
            _gen(match.group("cap_speed")), int(match.group("cap_width")), match.group("at"), raw.strip()))
    return tuple(notes)

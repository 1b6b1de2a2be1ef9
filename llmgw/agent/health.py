"""GPU health and fabrics, read every `HEALTH_INTERVAL` seconds and carried by every heartbeat (the latest).

One reading (`HealthReader.read`, blocking):
- NVML first (`llmgw.agent.nvml_health`, when the reader has an NVML module and `nvmlInit` works, `source`
  "nvml"): per card PCIe maxima, ECC counts, retired pages, remapped rows, clock event reasons, NVLink fabric
  state, MIG carving, and every NVLink's error counters. Else `nvidia-smi -q -x` for the same card fields
  (`llmgw.tools.parse_smi_health`, `source` "nvidia-smi") and `nvidia-smi nvlink -e` for the counters. NVLink
  counters are judged by how much they rose since the previous reading (`llmgw.tools.nvlink_error_findings`,
  DCGM's limits). No NVML and no nvidia-smi (a CPU node): no GPU health, the kernel log is not read, `source`
  "none". nvidia-smi
  failing: the kernel log's XIDs are reported unattributed, no card is judged, `source` "none" (the control plane
  then leaves every card as it was: a tool failing never moves a replica). A card nvidia-smi no longer lists is
  out of placement at the control plane (`llmgw.control.health`).
- The kernel log since the last reading: `journalctl -k -o short-iso --show-cursor`, the first time with `-b`
  (this boot, so XIDs from before the agent started count) and then `--after-cursor` the cursor journalctl
  printed, so no line is read twice. Without journalctl (or when it fails): `dmesg`, keeping only lines whose
  "[seconds since boot]" is past the last one read. XIDs (`parse_xids`) count for `xid_hold` seconds (default one
  hour) after the agent read them: a card a Xid 79/48/94/95 took out comes back when that has passed without a
  new one (the driver says nothing when a reset cleared it). The kernel's "PCIe bandwidth ... limited by" notes
  are printed once at boot and kept for as long as the agent runs.
- Fabrics: InfiniBand / RoCE ports from sysfs and IMEX's configuration (`llmgw.agent.discovery.read_fabrics`);
  where IMEX is configured, `nvidia-imex-ctl -N -j -H` says whether it is up: the domain UP, this node's daemon
  (matched by `own_names`, the host name by default) READY and connected to every peer (`llmgw.tools.imex`);
  `HealthWatch.report` re-reads these on every heartbeat, so a port going down shows at the next beat. Each active
  InfiniBand port's fabric is named by its subnet managers, read with each health reading: `saquery SMIR -C ca -P
  port` (every SM of the fabric; `llmgw.tools.fabric_id`, the lowest GUID, so a master failover keeps the name),
  else `sminfo -C ca -P port` (the master only). Neither installed: the fabric is unknown, with a note.
  Each fabric's map (`ibnetdiscover -C ca -P port`, at most every five minutes) places each active port under its
  leaf switch, found by the adapter's sysfs `node_guid` (`llmgw.tools.adapter_leaves`): every node reads its own
  fabric's map (issue 14 asks for one node per fabric; that coordination is not built).
The verdicts are `llmgw.tools.node_health`; cards the agent settings ignore are left out (their XIDs too).
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

from llmgw.agent.discovery import SysfsFabrics, run_tool
from llmgw.agent.discovery.node import Runner
from llmgw.agent.nvml_health import read_nvml_health
from llmgw.tools import (
    CardHealth, IbPort, NvLinkCard, ParseError, PcieBandwidthNote, XidEvent, fabric_id, imex_ready, node_health,
    adapter_leaves, node_guid, nvlink_domain, nvlink_error_findings, parse_ibnetdiscover, parse_imex_status,
    parse_nvlink_errors, parse_pcie_bandwidth,
    parse_saquery_smir, parse_smi_health, parse_sminfo, parse_xids, with_card_findings,
)
from llmgw.tools.node_report import NodeHealthReport
from llmgw.wire import pb

HEALTH_INTERVAL = 60.0
"""Seconds between health readings (issue 14: "read every minute")."""
XID_HOLD = 3600.0
"""Seconds an XID counts after the agent read it."""
IBNETDISCOVER_INTERVAL = 300.0
"""Seconds between two `ibnetdiscover` runs per fabric (issue 14: every five minutes)."""

_CURSOR = re.compile(r"^-- cursor: (?P<cursor>\S+)\s*$")
_DMESG_TS = re.compile(r"^\[\s*(?P<ts>[0-9]+\.[0-9]+)\]")


def split_journal_cursor(text: str) -> tuple[str, str | None]:
    """(the log lines, the cursor) of `journalctl --show-cursor` output: the cursor is the last "-- cursor: ..."
    line (None when journalctl printed none: no entries). "-- No entries --" lines are dropped."""
    cursor = None
    lines = []
    for line in text.splitlines():
        match = _CURSOR.match(line)
        if match:
            cursor = match.group("cursor")
        elif line.strip() != "-- No entries --":
            lines.append(line)
    return "\n".join(lines), cursor


def dmesg_after(text: str, after: float | None) -> tuple[str, float | None]:
    """The lines of `dmesg` output printed after `after` (seconds since boot; None: every line), and the latest
    timestamp seen (None when no line has one). A line without a timestamp (a continuation) follows its line."""
    keep, latest, taking = [], after, after is None
    for line in text.splitlines():
        match = _DMESG_TS.match(line)
        if match:
            stamp = float(match.group("ts"))
            taking = after is None or stamp > after
            latest = stamp if latest is None else max(latest, stamp)
        if taking:
            keep.append(line)
    return "\n".join(keep), latest


class KernelLog:
    """The kernel log lines printed since the last `read_new()`, through `run` (see `llmgw.agent.discovery`)."""

    def __init__(self, run: Runner = run_tool):
        self._run = run
        self.cursor: str | None = None
        self._dmesg_after: float | None = None

    def read_new(self) -> tuple[str, tuple[str, ...]]:
        """(new lines, notes): journalctl after the cursor, else dmesg after the last timestamp. Blocking.
        Never raises: what cannot be read is a note ("" lines)."""
        argv = ["journalctl", "-k", "--no-pager", "-o", "short-iso", "--show-cursor"]
        argv += ["--after-cursor", self.cursor] if self.cursor else ["-b"]
        out = self._run(argv)
        if out is not None and out.exit_code == 0:
            text, cursor = split_journal_cursor(out.text)
            if cursor is not None:
                self.cursor = cursor
            return text, ()
        why = "not installed" if out is None else f"exited {out.exit_code}: {out.text.strip()[:120]!r}"
        dmesg = self._run(["dmesg"])
        if dmesg is None or dmesg.exit_code != 0:
            how = "not installed" if dmesg is None else f"exited {dmesg.exit_code}: {dmesg.text.strip()[:120]!r}"
            return "", (f"kernel log not read: journalctl {why}; dmesg {how}",)
        text, self._dmesg_after = dmesg_after(dmesg.text, self._dmesg_after)
        return text, ()


def port_fabric(run: Runner, ca: str, port: int) -> tuple[str, str]:
    """(fabric id, note) of InfiniBand adapter `ca` port `port`: the lowest SM GUID `saquery SMIR` lists, else
    the master's GUID from `sminfo`; ("", why) when neither tells. Blocking; never raises."""
    where = ["-C", ca, "-P", str(port)]
    out = run(["saquery", "SMIR", *where])
    if out is not None and out.exit_code == 0:
        try:
            found = fabric_id(parse_saquery_smir(out.text))
        except ParseError:
            found = None
        if found:
            return found, ""
    out = run(["sminfo", *where])
    if out is None:
        return "", f"{ca}/{port}: fabric unknown (infiniband-diags' saquery and sminfo are not installed)"
    try:
        return parse_sminfo(out.text).guid, ""
    except ParseError as exc:
        return "", f"{ca}/{port}: fabric unknown ({exc})"


class HealthReader:
    """Reads a node's health (see the module docstring), keeping the kernel log cursor and the XIDs of the last
    `xid_hold` seconds between readings. `interval` the seconds between readings `HealthWatch` keeps. `clock`
    (monotonic seconds) and `wall` (unix seconds) are injectable. `fabric_source` (default `SysfsFabrics(sys_root,
    etc_root)`) has `fabrics() -> Fabrics` and `node_guid_text(ca) -> str`."""

    def __init__(self, run: Runner = run_tool, *, sys_root: Path = Path("/sys"), etc_root: Path = Path("/etc"),
                 xid_hold: float = XID_HOLD, interval: float = HEALTH_INTERVAL, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, nvml: Any = None, own_names: tuple[str, ...] | None = None,
                 fabric_source: Any = None):
        self._run = run
        self._fabric_source = fabric_source if fabric_source is not None else SysfsFabrics(sys_root, etc_root)
        self.own_names = own_names if own_names is not None else (socket.gethostname(),)
        self._nvml = nvml
        self._source = "none"
        self._nvlinks: dict[int, tuple[float, NvLinkCard]] = {}  # card index -> (when read, counters)
        self._nvlink_findings: dict[int, tuple] = {}
        self._maps: dict[str, tuple[float, dict[tuple[str, int], str]]] = {}  # fabric -> (when read, leaves)
        self.kernel = KernelLog(run)
        self.sys_root = sys_root
        self.etc_root = etc_root
        self.xid_hold = xid_hold
        self.interval = interval
        self._clock = clock
        self._wall = wall
        self._xids: list[tuple[float, XidEvent]] = []
        self._notes: dict[tuple[str, str], PcieBandwidthNote] = {}
        self._base: dict = {}
        self._base_notes: tuple[str, ...] = ()
        self._installed = False
        self._cards: tuple[CardHealth, ...] | None = None

    def fabrics(self) -> tuple[tuple[IbPort, ...], bool]:
        """(InfiniBand ports, IMEX configured), from sysfs and /etc (or the reader's `fabric_source`: a capture
        directory for `llmgw node doctor --from`). Blocking (file reads); never raises."""
        fabrics = self._fabric_source.fabrics()
        return fabrics.infiniband, fabrics.imex

    def read(self, skip_cards: frozenset[int] = frozenset()) -> NodeHealthReport:
        """Read and judge now; cards whose index is in `skip_cards` (ignored by the agent settings) are left out.
        Blocking (up to two tool runs of `llmgw.agent.discovery.TOOL_TIMEOUT` s each). Never raises for missing
        or failing tools: each becomes a note."""
        notes: list[str] = []
        ports, imex = self.fabrics()
        if imex:
            imex = self._imex_up(notes)
        port_fabrics = []
        for p in ports:
            if p.link_layer.lower() == "infiniband" and p.state.lower() == "active":
                fabric, why = port_fabric(self._run, p.ca, p.port)
                if fabric:
                    port_fabrics.append((p.ca, p.port, fabric))
                if why:
                    notes.append(why)
        self._base = dict(imex=imex, ib_ports=ports, port_fabrics=tuple(port_fabrics),
                          port_leaves=self._port_leaves(port_fabrics, notes), read_at=self._wall())
        self._cards = None
        if not self._read_cards(notes):
            self._installed = False
            self._base_notes = (*notes, "nvidia-smi is not installed: no GPU health")
            return self.judge(skip_cards)
        self._installed = True
        text, log_notes = self.kernel.read_new()
        notes.extend(log_notes)
        now = self._clock()
        self._xids = [(t, e) for t, e in self._xids if now - t < self.xid_hold]
        self._xids.extend((now, event) for event in parse_xids(text))
        for note in parse_pcie_bandwidth(text):
            self._notes[(note.pci_bus_id, note.line)] = note
        self._base_notes = tuple(notes)
        return self.judge(skip_cards)

    def _port_leaves(self, port_fabrics: list[tuple[str, int, str]], notes: list[str]) -> tuple[tuple[str, int, str], ...]:
        """((adapter, port, leaf switch GUID), ...) for the active InfiniBand ports of known fabric: each fabric's
        map is read with `ibnetdiscover -C ca -P port` through its first port, at most every `IBNETDISCOVER_INTERVAL`
        seconds, and each adapter is found in it by its sysfs node GUID (`llmgw.tools.adapter_leaves`)."""
        now = self._clock()
        out = []
        for fabric in sorted({f for _, _, f in port_fabrics}):
            ca, port = next((c, p) for c, p, f in port_fabrics if f == fabric)
            cached = self._maps.get(fabric)
            if cached is None or now - cached[0] >= IBNETDISCOVER_INTERVAL:
                result = self._run(["ibnetdiscover", "-C", ca, "-P", str(port)])
                leaves: dict[tuple[str, int], str] = {}
                if result is None:
                    notes.append("ibnetdiscover is not installed (infiniband-diags): leaves unknown")
                elif result.exit_code != 0:
                    notes.append(f"ibnetdiscover -C {ca} -P {port} exited {result.exit_code}: "
                                 f"{result.text.strip()[:160]!r}")
                else:
                    try:
                        leaves = adapter_leaves(parse_ibnetdiscover(result.text))
                    except ParseError as exc:
                        notes.append(str(exc))
                cached = self._maps[fabric] = (now, leaves)
            for c, p, f in port_fabrics:
                if f != fabric:
                    continue
                text = self._fabric_source.node_guid_text(c)
                guid = node_guid(text) if text else ""
                leaf = cached[1].get((guid, p), "")
                if leaf:
                    out.append((c, p, leaf))
        return tuple(out)

    def _imex_up(self, notes: list[str]) -> bool:
        """Whether IMEX is up here, from `nvidia-imex-ctl -N -j -H` (`llmgw.tools.imex_ready`); its configuration
        exists (the caller checked). Without nvidia-imex-ctl: taken as up, with a note."""
        out = self._run(["nvidia-imex-ctl", "-N", "-j", "-H"])
        if out is None:
            notes.append("IMEX configured (/etc/nvidia-imex) but nvidia-imex-ctl is not installed: taken as up")
            return True
        if out.exit_code != 0:
            notes.append(f"nvidia-imex-ctl -N exited {out.exit_code} (IMEX not running?): "
                         f"{out.text.strip()[:160]!r}")
            return False
        try:
            up, why = imex_ready(parse_imex_status(out.text), self.own_names)
        except ParseError as exc:
            notes.append(str(exc))
            return False
        if why:
            notes.append(why)
        return up

    def _read_cards(self, notes: list[str]) -> bool:
        """Read the cards' health fields and NVLink counters into `self._cards` (None when unread), NVML first;
        False when neither NVML nor nvidia-smi is there."""
        nvml = read_nvml_health(self._nvml)
        links: tuple[NvLinkCard, ...] = ()
        if nvml is not None:
            self._cards, links, self._source = nvml.cards, nvml.nvlinks, "nvml"
            notes.extend(nvml.notes)
        else:
            out = self._run(["nvidia-smi", "-q", "-x"])
            if out is None:
                return False
            self._source = "nvidia-smi"
            if out.exit_code != 0:
                notes.append(f"nvidia-smi -q -x exited {out.exit_code}: {out.text.strip()[:200]!r}")
                return True
            try:
                self._cards = parse_smi_health(out.text)
            except ParseError as exc:
                notes.append(f"nvidia-smi -q -x: {exc}")
                return True
            errors = self._run(["nvidia-smi", "nvlink", "-e"])
            if errors is not None and errors.exit_code == 0:
                try:
                    links = parse_nvlink_errors(errors.text)
                except ParseError as exc:
                    notes.append(f"nvidia-smi nvlink -e: {exc}")
        now = self._clock()
        source = "NVML nvmlDeviceGetNvLinkErrorCounter" if nvml is not None else "nvidia-smi nvlink -e"
        findings = {}
        for card in links:
            before = self._nvlinks.get(card.gpu)
            findings[card.gpu] = nvlink_error_findings(card, before[1] if before else None,
                                                       now - before[0] if before else None, source)
            self._nvlinks[card.gpu] = (now, card)
        self._nvlink_findings = findings
        return True

    def judge(self, skip_cards: frozenset[int] = frozenset()) -> NodeHealthReport:
        """The last reading judged again with `skip_cards` left out: no I/O (used when `ignore_gpus` changes, so
        a new Register carries verdicts at once). Before any reading: an empty report."""
        if not self._installed:
            return NodeHealthReport(**self._base, notes=self._base_notes)
        if self._cards is None:  # no verdicts: the kernel log's XIDs are shown, no card is judged (source "none")
            health = node_health((), tuple(e for _, e in self._xids))
            return NodeHealthReport(health=health, notes=self._base_notes, **self._base)
        skipped = {c.pci_bus_id for c in self._cards if c.index in skip_cards}
        cards = tuple(c for c in self._cards if c.index not in skip_cards)
        xids = tuple(e for _, e in self._xids if e.pci_bus_id not in skipped)
        health = node_health(cards, xids, pcie_notes=tuple(self._notes.values()))
        health = with_card_findings(health, {i: f for i, f in self._nvlink_findings.items() if i not in skip_cards})
        return NodeHealthReport(health=health, domain=nvlink_domain(cards), source=self._source,
                                notes=self._base_notes, **self._base)


def report_message(report: NodeHealthReport) -> pb.HealthReport:
    """`report` as the wire's `HealthReport`."""

    def finding(f) -> pb.HealthFinding:
        return pb.HealthFinding(level=str(f.level), code=f.code, message=f.message, source=f.source,
                                blocks_placement=f.blocks_placement)

    message = pb.HealthReport(
        read_at=report.read_at, source=report.source,
        cards=[pb.HealthCard(index=c.index, uuid=c.uuid, pci_bus_id=c.pci_bus_id,
                             findings=[finding(f) for f in c.findings]) for c in report.health.cards],
        unattributed=[finding(f) for f in report.health.unattributed],
        nvlink_domain=report.domain.domain or "", nvlink_domain_reason=report.domain.reason,
        nvlink_clique_ids=list(report.domain.clique_ids), imex=report.imex, notes=list(report.notes),
    )
    for port in report.ib_ports:
        entry = message.ib_ports.add(adapter=port.ca, port=port.port, state=port.state,
                                     physical_state=port.physical_state, link_layer=port.link_layer,
                                     fabric=report.port_fabric(port.ca, port.port),
                                     leaf=report.port_leaf(port.ca, port.port))
        if port.rate_gbps is not None:
            entry.rate_gbps = port.rate_gbps
    return message


@dataclass
class HealthWatch:
    """The latest health reading of this node, renewed every `interval` seconds by `run()` once the first reading
    was taken (by `take()`, which Register calls after discovery), `interval` the reader's. `skip()` gives the
    ignored cards' indexes."""

    reader: HealthReader
    skip: Callable[[], frozenset[int]]
    latest: NodeHealthReport | None = None

    def __post_init__(self) -> None:
        self._lock = trio.Lock()
        self._first = trio.Event()

    async def take(self, skip: frozenset[int] | None = None) -> NodeHealthReport:
        """Read now (in a thread) and keep it as the latest; `skip` the ignored cards' indexes (default:
        `self.skip()`). A checkpoint; one reading at a time."""
        async with self._lock:
            skip = self.skip() if skip is None else skip
            self.latest = await trio.to_thread.run_sync(self.reader.read, skip)
        self._first.set()
        return self.latest

    def judged(self, skip: frozenset[int]) -> NodeHealthReport:
        """The last reading judged again with `skip` (no I/O, no checkpoint); the latest from now on."""
        self.latest = self.reader.judge(skip)
        return self.latest

    def report(self) -> NodeHealthReport | None:
        """The latest reading with the fabrics read again now (a port that went down shows at once); None before
        the first reading. Blocks for a few sysfs reads (microseconds, like the heartbeat's disk space)."""
        if self.latest is None:
            return None
        ports, imex = self.reader.fabrics()  # IMEX's configuration gone: down at once; else as last read
        return replace(self.latest, ib_ports=ports, imex=imex and self.latest.imex)

    async def run(self) -> None:
        """Take a reading every `interval` seconds, forever, from the first `take()` on."""
        await self._first.wait()
        while True:
            await trio.sleep(self.reader.interval)
            await self.take()

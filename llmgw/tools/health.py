"""Per-card health verdicts from what the parsers read: PCIe link, XIDs, remapped rows, retired pages, ECC, clock
event reasons, NVLink fabric membership and MIG carving. Pure functions; the control plane decides what a verdict
changes (placement, warnings, metrics).

A verdict is ok, warn or fail. Every finding names its source (the tool and field, or the kernel log line) and
says what to do. A finding that means the card cannot be trusted to compute (`Level.FAIL`) or cannot be placed as
it stands (an uncarved MIG card) has `blocks_placement`; the card comes back when the finding clears.

Sources of the rules:
- PCIe: the current generation drops whenever a card idles (NVML, nvmlDeviceGetCurrPcieLinkGeneration), so only
  the maxima are compared: the generation card and slot allow together against the card's own (or the expected)
  maximum, and the width trained against the widest the link allows. Some cards also narrow the link at idle (the
  telegraf captures of an A10G at gen1 x8 of gen4 x16), so a narrow link is judged only while it runs at its full
  generation. Per-lane rates per direction (PCI-SIG base specifications: 8b/10b for gen 1-2, 128b/130b for 3-5,
  FLIT for 6): `LANE_GBYTES`. `lspci -vv`'s LnkCap (what both ends can do) and LnkSta (what trained) say the same
  from the kernel's side.
- XIDs: `llmgw.tools.xid` (NVIDIA's XID catalog).
- Remapped rows and retired pages: NVIDIA "GPU Memory Error Management" (docs.nvidia.com/deploy/a100-gpu-mem-error-
  mgmt): a pending remap takes effect at the next GPU reset; a remapping failure needs service. Dynamic page
  retirement: a pending retirement takes effect at the next reset.
- Fabric: `nvidia-smi -q` Fabric section; a card whose registration did not complete (state other than Completed,
  status other than Success) is not part of its NVLink domain.
- NVLink error counters between two readings (`nvlink_error_findings`): NVIDIA DCGM's health watch
  (NVIDIA/DCGM modules/health/DcgmHealthWatch.cpp, MonitorNVLink, and GpuHardwareLimits.h): a replay or recovery
  error count rising by `NVLINK_ERROR_LIMIT` (1) or more fails (DCGM_FR_NVLINK_ERROR_CRITICAL); a CRC (flit or
  data) count rising at `NVLINK_CRC_RATE_LIMIT` (100) per second or more fails (DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD,
  "RM has informed us that CRC errors only matter at rates of 100+ per second"); a slower CRC rise warns
  (DCGM_FR_NVLINK_ERROR_THRESHOLD). A failing link takes its card out of placement, as DCGM's FAIL means.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from llmgw.tools.kernel_log import PcieBandwidthNote, XidEvent
from llmgw.tools.nvidia_nvlink import NvLinkCard
from llmgw.tools.nvidia_smi_health import CardHealth, PcieLink, RemappedRows
from llmgw.tools.xid import XidAction, classify_xid

# GB/s per lane and direction, by PCIe generation.
LANE_GBYTES = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# DCGM's limits for NVLink error counters (GpuHardwareLimits.h: DCGM_LIMIT_MAX_NVLINK_ERROR,
# DCGM_LIMIT_MAX_NVLINK_CRC_ERROR).
NVLINK_ERROR_LIMIT = 1
NVLINK_CRC_RATE_LIMIT = 100.0
_CRITICAL_COUNTERS = ("Replay Errors", "Recovery Errors")
_CRC_COUNTERS = ("CRC Errors", "CRC Data Errors", "Data CRC Errors")
# Clock event reasons that mean the card is being slowed by heat or its power supply, not by its own policy.
SLOWDOWN_EVENTS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")


class Level(enum.IntEnum):
    """How bad a finding is: OK (nothing to say), WARN (the operator should look), FAIL (the card cannot be trusted
    to compute). Ordered, so `max()` gives the worst."""

    OK = 0
    WARN = 1
    FAIL = 2

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Finding:
    """One thing found: `level`, `code` (a stable word: "pcie-gen", "pcie-width", "pcie-limited", "xid",
    "remap-pending", "remap-failure", "retire-pending", "ecc-uncorrected", "clock-slowdown", "fabric-unjoined",
    "fabric-degraded", "mig-uncarved", "nvlink-inactive", "nvlink-errors"), `message` (a sentence: what, and what
    to do), `source` (the tool and field or log line it came from), `blocks_placement` (the card leaves placement
    until this clears)."""

    level: Level
    code: str
    message: str
    source: str
    blocks_placement: bool = False


@dataclass(frozen=True)
class CardVerdict:
    """One card's findings. `level` the worst (OK without findings); `placeable` False when any finding blocks
    placement."""

    index: int
    pci_bus_id: str
    uuid: str
    findings: tuple[Finding, ...] = ()

    @property
    def level(self) -> Level:
        return max((f.level for f in self.findings), default=Level.OK)

    @property
    def placeable(self) -> bool:
        return not any(f.blocks_placement for f in self.findings)

    @property
    def reasons(self) -> tuple[str, ...]:
        """The messages of the findings that block placement."""
        return tuple(f.message for f in self.findings if f.blocks_placement)


@dataclass(frozen=True)
class NodeHealth:
    """Every card's verdict, plus `unattributed`: findings from XIDs of PCI addresses no card answers for (a card
    that fell off the bus is missing from nvidia-smi, so its Xid 79 lands here)."""

    cards: tuple[CardVerdict, ...]
    unattributed: tuple[Finding, ...] = ()

    @property
    def level(self) -> Level:
        """The worst level over every card and every unattributed finding (OK when there are none)."""
        return max((*(c.level for c in self.cards), *(f.level for f in self.unattributed)), default=Level.OK)


def link_gbytes(generation: int | None, lanes: int | None) -> float | None:
    """GB/s per direction of a PCIe link (gen 5 x16 = 63.0); None when either is unknown or out of the table."""
    if generation is None or lanes is None or generation not in LANE_GBYTES:
        return None
    return round(LANE_GBYTES[generation] * lanes, 1)


def _gb(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def pcie_findings(link: PcieLink, pci_bus_id: str = "", *, expected_gen: int | None = None,
                  expected_width: int | None = None) -> tuple[Finding, ...]:
    """Judge a card's PCIe link by its maxima, never its current generation.

    `expected_gen` / `expected_width`: what this card should get (from its GPU class or the operator); by default
    the card's own maximum generation (`gen_device_max`) and the link's maximum width. Warns when card and slot
    together allow an older generation than expected (the card sits in an older slot), when the link's maximum
    width is below the expected width (a narrower slot), and when the link runs at its full generation on fewer
    lanes than it allows (trained at x8 instead of x16). Each message gives the GB/s carried against what it
    could carry and points at `lspci -vv`'s LnkCap/LnkSta. Unknown values give no finding.
    """
    findings = []
    lspci = f"compare LnkCap with LnkSta in `lspci -vv -s {pci_bus_id[-12:] or '<bus id>'}`"
    source = "nvidia-smi -q -x: pci/pci_gpu_link_info"
    capable = link.gen_capable
    want_gen = expected_gen if expected_gen is not None else link.gen_device_max
    width = link.width_max if link.width_max is not None else link.width_current
    if capable is not None and want_gen is not None and capable < want_gen:
        if link.gen_device_max is not None and link.gen_device_max < want_gen:
            what = f"the card should run at gen {want_gen} but itself allows only gen {link.gen_device_max}"
            fix = "check the card's model and firmware"
        else:
            slot = f"the slot allows gen {link.gen_host_max}" if link.gen_host_max is not None else \
                f"card and slot allow gen {capable}"
            what = f"the card supports gen {want_gen} but {slot}"
            fix = f"move it to a gen {want_gen} slot or check the BIOS link speed setting"
        findings.append(Finding(Level.WARN, "pcie-gen", (
            f"PCIe: {what}: it carries {_gb(link_gbytes(capable, width))} GB/s of "
            f"{_gb(link_gbytes(want_gen, width))} GB/s; {fix} ({lspci})"), source))
    gen_now = capable if capable is not None else want_gen
    if expected_width is not None and link.width_max is not None and link.width_max < expected_width:
        findings.append(Finding(Level.WARN, "pcie-width", (
            f"PCIe: the slot allows x{link.width_max} but the card should have x{expected_width}: it carries "
            f"{_gb(link_gbytes(gen_now, link.width_max))} GB/s of {_gb(link_gbytes(gen_now, expected_width))} GB/s "
            f"({lspci})"), source))
    elif (link.width_current is not None and link.width_max is not None and link.width_current < link.width_max
          and link.gen_current is not None and capable is not None and link.gen_current >= capable):
        findings.append(Finding(Level.WARN, "pcie-width", (
            f"PCIe: the link trained at x{link.width_current} of x{link.width_max}: it carries "
            f"{_gb(link_gbytes(link.gen_current, link.width_current))} GB/s of "
            f"{_gb(link_gbytes(link.gen_current, link.width_max))} GB/s; reseat the card or check its riser "
            f"({lspci})"), source))
    return tuple(findings)


def pcie_bandwidth_findings(notes: Iterable[PcieBandwidthNote]) -> tuple[Finding, ...]:
    """The kernel's boot-time notes of a PCIe device limited by a slower or narrower link on its way to the CPU
    (warn), with the Gb/s available against capable and the device whose link limits it."""
    findings = []
    for note in notes:
        if not note.limited:
            continue
        why = []
        if note.gen is not None and note.capable_gen is not None and note.gen < note.capable_gen:
            why.append(f"gen {note.gen} instead of gen {note.capable_gen}")
        if note.width < note.capable_width:
            why.append(f"x{note.width} instead of x{note.capable_width}")
        findings.append(Finding(Level.WARN, "pcie-limited", (
            f"PCIe: the kernel found {note.available_gbps:g} Gb/s available of {note.capable_gbps:g} Gb/s, limited "
            f"by the link at {note.limited_at or 'an unknown device'} ({', '.join(why) or 'a slower link'}); "
            f"check that slot, riser or switch (`lspci -vv -s {note.limited_at or '<bus id>'}`: LnkCap, LnkSta)"),
            f"kernel log: {note.line}"))
    return tuple(findings)


def xid_findings(events: Iterable[XidEvent]) -> tuple[Finding, ...]:
    """One finding per distinct XID number among `events` (the last line of each as its source), by NVIDIA's
    catalog: RESET_GPU and REBOOT fail and block placement, WATCH and RESTART_APP warn, IGNORE says nothing.
    Xid 154 is judged by the recovery action its message names."""
    last: dict[tuple[int, str], XidEvent] = {}
    counts: dict[tuple[int, str], int] = {}
    for event in events:
        key = (event.xid, classify_xid(event.xid, event.message).action.value)
        last[key] = event
        counts[key] = counts.get(key, 0) + 1
    findings = []
    for key, event in last.items():
        info = classify_xid(event.xid, event.message)
        if info.action is XidAction.IGNORE:
            continue
        times = f" ({counts[key]} times)" if counts[key] > 1 else ""
        what = {
            XidAction.RESTART_APP: "the application on it failed; the card keeps working",
            XidAction.WATCH: "the card keeps working; watch it",
            XidAction.RESET_GPU: "the card needs a GPU reset (nvidia-smi -r) before it computes again",
            XidAction.REBOOT: "the machine needs a reboot (and a check of the card's seating and power)",
        }[info.action]
        note = f"; {info.note}" if info.note else ""
        level = Level.FAIL if info.action.takes_card_out else Level.WARN
        findings.append(Finding(level, "xid", f"Xid {event.xid}{times}, {info.description}: {what}{note}",
                                f"kernel log: {event.line}", blocks_placement=info.action.takes_card_out))
    return tuple(findings)


def _remap_counts(rows: RemappedRows | None) -> str:
    """" (rows remapped: 0 for correctable, 0 for uncorrectable errors; 2 banks without a spare row)" as far as
    known, the evidence behind a remap finding; "" when nothing is known."""
    if rows is None:
        return ""
    parts = []
    if rows.correctable is not None or rows.uncorrectable is not None:
        known = [f"{n} for {kind} errors" for n, kind in ((rows.correctable, "correctable"),
                                                          (rows.uncorrectable, "uncorrectable")) if n is not None]
        parts.append("rows remapped: " + ", ".join(known))
    if rows.banks_without_spare:
        parts.append(f"{rows.banks_without_spare} banks without a spare row")
    return f" ({'; '.join(parts)})" if parts else ""


def memory_findings(card: CardHealth) -> tuple[Finding, ...]:
    """Remapped rows (pending: warn; failure: fail), retired pages (pending: warn) and uncorrectable ECC errors
    since the driver loaded (warn)."""
    findings = []
    rows = card.remapped_rows
    counts = _remap_counts(rows)
    if rows is not None and rows.failure:
        findings.append(Finding(Level.FAIL, "remap-failure",
                                "row remapping failed: the card's memory has errors it cannot repair; it needs "
                                f"service (RMA){counts}", "nvidia-smi -q -x: remapped_rows/remapped_row_failure",
                                blocks_placement=True))
    if rows is not None and rows.pending:
        findings.append(Finding(Level.WARN, "remap-pending",
                                "a memory row remap waits for a GPU reset: reset the card (nvidia-smi -r) when it "
                                f"is idle{counts}", "nvidia-smi -q -x: remapped_rows/remapped_row_pending"))
    pages = card.retired_pages
    if pages is not None and pages.pending:
        findings.append(Finding(Level.WARN, "retire-pending",
                                "a memory page retirement waits for a GPU reset: reset the card when it is idle",
                                "nvidia-smi -q -x: retired_pages/pending_retirement"))
    if card.ecc.volatile_uncorrected:
        findings.append(Finding(Level.WARN, "ecc-uncorrected",
                                f"{card.ecc.volatile_uncorrected} uncorrectable ECC error(s) since the driver "
                                "loaded", "nvidia-smi -q -x: ecc_errors/volatile"))
    return tuple(findings)


def fabric_findings(card: CardHealth) -> tuple[Finding, ...]:
    """A card that reports an NVLink fabric but has not joined it (warn), or whose fabric bandwidth is degraded
    (warn). No fabric, "Not Supported" or a placeholder: nothing."""
    fabric = card.fabric
    if fabric is None or fabric.state.lower() in ("", "not supported"):
        return ()
    source = "nvidia-smi -q -x: fabric"
    if not fabric.joined:
        return (Finding(Level.WARN, "fabric-unjoined",
                        f"NVLink fabric state {fabric.state!r}, status {fabric.status!r}: the card has not joined "
                        "its NVLink domain, so it cannot take part in a multi-node NVLink placement; check "
                        "nvidia-fabricmanager and nvidia-imex on this node", source),)
    if fabric.bandwidth and fabric.bandwidth.lower() not in ("full", "n/a"):
        return (Finding(Level.WARN, "fabric-degraded",
                        f"NVLink fabric bandwidth is {fabric.bandwidth!r}, not Full", source),)
    return ()


def nvlink_findings(status: NvLinkCard | None = None, errors: NvLinkCard | None = None) -> tuple[Finding, ...]:
    """One card's NVLinks: links inactive while others of the card are up (warn: the card talks to its peers at
    reduced bandwidth), and links whose error counters are not zero since the driver loaded (warn, naming the
    links and counters). `status` from `nvidia-smi nvlink -s`, `errors` from `nvlink -e`, for the same card."""
    findings = []
    if status is not None and any(link.active for link in status.links):
        down = [link.link for link in status.links if not link.active]
        if down:
            findings.append(Finding(Level.WARN, "nvlink-inactive",
                                    f"NVLink {', '.join(map(str, down))} of GPU {status.gpu} inactive while "
                                    f"{sum(link.active for link in status.links)} are up: peer traffic runs at "
                                    "reduced bandwidth; reset the GPU or check the NVSwitch/fabric manager",
                                    "nvidia-smi nvlink -s"))
    if errors is not None:
        noisy = [(link.link, {k: v for k, v in link.counters.items() if v}) for link in errors.links if link.errors]
        if noisy:
            where = "; ".join(f"link {n}: " + ", ".join(f"{k} {v}" for k, v in c.items()) for n, c in noisy)
            findings.append(Finding(Level.WARN, "nvlink-errors",
                                    f"NVLink errors on GPU {errors.gpu} since the driver loaded ({where})",
                                    "nvidia-smi nvlink -e"))
    return tuple(findings)


def nvlink_error_findings(now: NvLinkCard, before: NvLinkCard | None, seconds: float | None,
                          source: str = "NVML nvmlDeviceGetNvLinkErrorCounter") -> tuple[Finding, ...]:
    """Judge one card's NVLink error counters by how much they rose since the previous reading `before`, `seconds`
    ago (DCGM's thresholds, see the module docstring): replay or recovery errors rising fail and take the card out
    of placement; CRC errors rising at 100/s or more fail likewise; slower CRC errors warn. Without a previous
    reading (or `seconds` not positive) only the totals since the driver loaded are known: `nvlink_findings`'s
    warning. A counter that went down (the driver reloaded, or someone reset it) counts from 0."""
    if before is None or not seconds or seconds <= 0:
        return nvlink_findings(errors=now)
    old = {link.link: link.counters for link in before.links}
    failing, slow = [], []
    for link in now.links:
        for name, value in link.counters.items():
            if value is None:
                continue
            previous = old.get(link.link, {}).get(name)
            rise = value - previous if previous is not None and value >= previous else value
            if rise < NVLINK_ERROR_LIMIT:
                continue
            if name in _CRITICAL_COUNTERS:
                failing.append(f"link {link.link}: {name} +{rise}")
            elif name in _CRC_COUNTERS and rise / seconds >= NVLINK_CRC_RATE_LIMIT:
                failing.append(f"link {link.link}: {name} +{rise} ({rise / seconds:.0f}/s)")
            else:
                slow.append(f"link {link.link}: {name} +{rise}")
    findings = []
    span = f"in {seconds:g} s"
    if failing:
        findings.append(Finding(Level.FAIL, "nvlink-errors",
                                f"NVLink errors on GPU {now.gpu} {span} ({'; '.join(failing)}): replays, recoveries "
                                "or 100+ CRC errors a second mean the link is failing (DCGM's limits); reset the GPU "
                                "and check the NVLink/NVSwitch, or call the vendor if it returns",
                                source, blocks_placement=True))
    if slow:
        findings.append(Finding(Level.WARN, "nvlink-errors",
                                f"NVLink CRC errors on GPU {now.gpu} {span} ({'; '.join(slow)}), below DCGM's 100/s "
                                "limit: watch the link", source))
    return tuple(findings)


def with_card_findings(health: NodeHealth, extra: dict[int, tuple[Finding, ...]]) -> NodeHealth:
    """`health` with the findings of `extra` ({card index: findings}) added to those cards' verdicts."""
    if not any(extra.values()):
        return health
    cards = tuple(CardVerdict(c.index, c.pci_bus_id, c.uuid, c.findings + extra.get(c.index, ()))
                  for c in health.cards)
    return NodeHealth(cards, health.unattributed)


@dataclass(frozen=True)
class DomainMembership:
    """A node's place in a multi-node NVLink domain: `domain` the ClusterUUID all its cards share (None: no domain,
    e.g. a single machine's NVSwitch, or cards that disagree), `clique_ids` the cards' CliqueIds, `unjoined` the
    indexes of cards that report a fabric but have not joined it, `reason` why the node is not in one domain
    ("" when it is)."""

    domain: str | None
    clique_ids: tuple[str, ...] = ()
    unjoined: tuple[int, ...] = ()
    reason: str = ""


def nvlink_domain(cards: Iterable[CardHealth]) -> DomainMembership:
    """Whether a node's cards form part of one multi-node NVLink domain (GB200 NVL72, NVLink Switch systems).

    A node is in domain D when every card has joined its fabric and reports ClusterUUID D (not all zeros). Cards
    without a fabric, or all-zero ClusterUUIDs, mean no domain and no reason to complain; unjoined cards or
    disagreeing UUIDs give `domain` None with a `reason`.
    """
    cards = tuple(cards)
    fabrics = [(c.index, c.fabric) for c in cards if c.fabric is not None and c.fabric.state.lower()
               not in ("", "not supported")]
    if not fabrics:
        return DomainMembership(None, reason="no card reports an NVLink fabric")
    unjoined = tuple(i for i, f in fabrics if not f.joined)
    cliques = tuple(f.clique_id for _, f in fabrics)
    domains = {f.domain for _, f in fabrics if f.joined}
    if unjoined:
        return DomainMembership(None, cliques, unjoined,
                                f"GPU {', '.join(map(str, unjoined))} not joined to the NVLink fabric")
    if len(fabrics) < len(cards):
        return DomainMembership(None, cliques, reason="some cards report no NVLink fabric")
    if domains == {None}:
        return DomainMembership(None, cliques, reason="single-machine NVSwitch (ClusterUUID all zeros): no domain")
    if len(domains) != 1 or None in domains:
        uuids = ", ".join(sorted(map(str, domains)))
        return DomainMembership(None, cliques, reason=f"cards report different ClusterUUIDs: {uuids}")
    return DomainMembership(domains.pop(), cliques)


def card_verdict(card: CardHealth, xids: Iterable[XidEvent] = (), *, expected_pcie_gen: int | None = None,
                 expected_pcie_width: int | None = None,
                 pcie_notes: Iterable[PcieBandwidthNote] = ()) -> CardVerdict:
    """Everything known about one card, judged. `xids` and `pcie_notes` (from the kernel log) may hold every
    device's lines: only those whose PCI address is this card's count."""
    mine = [e for e in xids if e.pci_bus_id == card.pci_bus_id]
    notes = [n for n in pcie_notes if n.pci_bus_id == card.pci_bus_id]
    findings = [*pcie_findings(card.pcie, card.pci_bus_id, expected_gen=expected_pcie_gen,
                               expected_width=expected_pcie_width), *pcie_bandwidth_findings(notes),
                *xid_findings(mine), *memory_findings(card), *fabric_findings(card)]
    slow = [e for e in card.clock_events if e in SLOWDOWN_EVENTS]
    if slow:
        findings.append(Finding(Level.WARN, "clock-slowdown",
                                f"clocks slowed by {', '.join(slow)}: check cooling and power",
                                "nvidia-smi -q -x: clocks_event_reasons"))
    if card.mig_enabled and card.mig_devices == 0:
        findings.append(Finding(Level.WARN, "mig-uncarved",
                                "MIG mode is on but no MIG instance is carved: the card cannot be placed whole or "
                                "in parts; carve instances or turn MIG off", "nvidia-smi -q -x: mig_mode, "
                                "mig_devices", blocks_placement=True))
    return CardVerdict(card.index, card.pci_bus_id, card.uuid, tuple(findings))


def node_health(cards: Iterable[CardHealth], xids: Iterable[XidEvent] = (), *,
                expected_pcie_gen: int | None = None, expected_pcie_width: int | None = None,
                pcie_notes: Iterable[PcieBandwidthNote] = ()) -> NodeHealth:
    """`card_verdict` for every card, and the XIDs of PCI addresses no card answers for as `unattributed` (PCIe
    notes of other devices, network adapters for example, are not judged here)."""
    cards = tuple(cards)
    events = tuple(xids)
    notes = tuple(pcie_notes)
    buses = {c.pci_bus_id for c in cards}
    verdicts = tuple(card_verdict(c, events, expected_pcie_gen=expected_pcie_gen,
                                  expected_pcie_width=expected_pcie_width, pcie_notes=notes) for c in cards)
    orphans = [e for e in events if e.pci_bus_id not in buses]
    unattributed = tuple(Finding(f.level, f.code, f"{bus}: {f.message}", f.source, f.blocks_placement)
                         for bus in sorted({e.pci_bus_id for e in orphans})
                         for f in xid_findings(e for e in orphans if e.pci_bus_id == bus))
    return NodeHealth(verdicts, unattributed)

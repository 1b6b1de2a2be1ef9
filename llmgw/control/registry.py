"""The fleet registry: what every agent last reported, and which nodes are lost.

Pure and immutable: `FleetRegistry` is a value; every transition returns a new registry and whether something
*placement-relevant* changed (see below), so the control loop holds it inside its one `ControlState`. Times are
seconds on the caller's clock (`trio.current_time()` in the control plane; any monotonic number in tests).

Placement-relevant (what wakes the planner and rebuilds the routing table; written in docs/design.md too):
- a node appearing, registering again, becoming lost, or its stream ending for good (lost);
- a shard's state, port or fingerprint, or a node's installed / installing engines;
- a card held or released by a process llmgw did not start (judged on every heartbeat);
- a card's free memory crossing what a model of the catalog needs per GPU (`memory_thresholds`);
- a node's board inlet crossing `serving.max_inlet_celsius` (`llmgw.plan.cordons.inlet_verdict`);
- a card's health verdict taking it out of placement or giving it back, or a node's NVLink domain or InfiniBand
  adapters changing (`llmgw.control.health`).
Readings alone (utilisation, power, temperatures, CPU, memory, disk, shard cores, engine counters) replace the
node's `readings` and advance its shards' `speeds` (`llmgw.control.engine_speeds`), and change nothing else: they
never wake the planner nor move a running replica.

Transitions of one node:

    (unknown) --register--> connected --stream ends--> disconnected --silent > lost_after--> lost
        ^                       |  ^                        |                                  |
        |                       |  +------ heartbeat -------+                                  |
        +------------------------------------------ register (shards adopted) ----------------+

A node counts as alive while it is connected or was heard from less than `lost_after` seconds ago: a
stream that breaks for a moment does not move its replicas. A lost node is offered to the planner with
`alive=False` and no shards, so its replicas are placed elsewhere; when it registers again it reports the
shards it still runs, and they are adopted as they are (the planner keeps them), never restarted.
"""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Iterable, Mapping
from typing import Any
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from rpds import HashTrieMap

from llmgw.control.engine_speeds import MeasuredSpeed, next_node_speeds
from llmgw.control.health import apply_health, with_interconnect
from llmgw.control.readings import NodeReadings
from llmgw.tools.node_report import NodeHealthReport
from llmgw.plan.cordons import inlet_verdict
from llmgw.plan.types import Fleet, GpuState, MemoryBandwidth, NodeState, ObservedShard
from llmgw.identity import EngineState


@dataclass(frozen=True)
class ShardDetail:
    """What an agent said about a shard beyond `ObservedShard`: pid, progress (0..1, None when unknown), log tail."""

    pid: int = 0
    progress: float | None = None
    progress_text: str = ""
    last_log_lines: tuple[str, ...] = ()
    adopted: bool = False


@dataclass(frozen=True)
class NodeRecord:
    """One node as the registry knows it.

    `state` is the node as last reported (shards included, even while lost). `last_seen` is the time of its
    last message; `lost` True once silent for longer than the registry's `lost_after`. Engine processes llmgw did not start are in
    `state.shards` with `adopted_foreign=True`: reported, never stopped.
    `engine_errors` maps "llama.cpp@b11434" to the last install error. `registered_at` is when it last registered. `readings` are the last heartbeat's
    readings (None before the first; see `NodeReadings.to_json` for the 60 s age limit). `engines_installable`
    and `features` are what the agent said it can do at Register. `health` the node's last GPU health and fabrics
    report (None before the first; kept across a new Register that carries none). `slurm` the node's last Slurm
    report as plain data (`llmgw.control.agents.slurm_summary`; None: the node has no part in Slurm). `firewall`
    the node's last firewall report ("digest", "error", "rolled_back"; None: it holds no table, nothing failed).
    `speeds` each shard's prefill and decode speed from its engine's counters, by shard id
    (`llmgw.control.engine_speeds`; a shard whose engine was never read is absent). `release_key` the id of the key
    that signed the release its agent runs ("": not installed from a release, or an older agent).
    """

    state: NodeState
    last_seen: float
    connected: bool = True
    lost: bool = False
    os: str = ""
    arch: str = ""
    agent_version: str = ""
    warnings: tuple[str, ...] = ()
    details: Mapping[str, ShardDetail] = field(default_factory=lambda: MappingProxyType({}))
    engine_errors: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    readings: NodeReadings | None = None
    registered_at: float = 0.0
    engines_installable: frozenset[str] = frozenset()
    features: frozenset[str] = frozenset()
    health: NodeHealthReport | None = None
    slurm: Mapping[str, Any] | None = None
    firewall: Mapping[str, str] | None = None
    speeds: Mapping[str, MeasuredSpeed] = field(default_factory=lambda: MappingProxyType({}))
    release_key: str = ""

    @property
    def node_id(self) -> str:
        return self.state.node_id


def _shard_key(shards: Iterable[ObservedShard]) -> tuple:
    """What of a shard list matters to planning and routing (not restart counters or error wording)."""
    return tuple(sorted((s.shard_id, s.state.value, s.port, s.fingerprint) for s in shards))


def _crosses(old: int, new: int, thresholds: tuple[int, ...]) -> bool:
    return any((old >= t) != (new >= t) for t in thresholds)


def apply_gpu_readings(
    gpus: tuple[GpuState, ...], readings: NodeReadings, thresholds: tuple[int, ...] = (),
) -> tuple[tuple[GpuState, ...], bool]:
    """Whole cards with this heartbeat's free memory and shared-card verdict; and whether that is placement-relevant.

    A card (`device_id` equal to the sample's index) gets `memory_free_bytes` = total - used when used memory was
    read, and `foreign_processes` = whether any process llmgw did not start holds it now. MIG instances keep
    what Register said (the readings are per card). Returns (gpus, changed): changed when a card was taken or
    released by another process, or its free memory crossed one of `thresholds` (bytes).
    """
    by_index = {str(sample.index): sample for sample in readings.gpus}
    out, changed = [], False
    for gpu in gpus:
        sample = None if gpu.is_mig else by_index.get(gpu.device_id)
        if sample is None:
            out.append(gpu)
            continue
        free = gpu.memory_free_bytes
        if sample.memory_used_bytes is not None:
            free = max(0, gpu.memory_total_bytes - sample.memory_used_bytes)
        foreign = bool(sample.foreign_pids)
        if foreign != gpu.foreign_processes or _crosses(gpu.memory_free_bytes, free, thresholds):
            changed = True
        if free != gpu.memory_free_bytes or foreign != gpu.foreign_processes:
            gpu = replace(gpu, memory_free_bytes=free, foreign_processes=foreign)
        out.append(gpu)
    return tuple(out), changed


class FleetRegistry:
    """Every node that registered, keyed by node id: an immutable value.

    Every transition returns `(registry, changed)`: a new registry, and True when something placement-relevant
    changed (see the module's docstring), so the caller knows to wake the planner and rebuild the routing table.
    `lost_after` seconds of silence make a node lost; `memory_thresholds` are the per-GPU memory needs (bytes) of
    the catalog's models, whose crossing by a card's free memory is placement-relevant.

    Cost at fleet scale: the records sit in a persistent hash map (`rpds.HashTrieMap`, the Rust structure
    jsonschema's `referencing` already brings), so a heartbeat makes a new registry in O(log n) that shares every
    other node's record, instead of copying a dict of n records (bench/fleet_scale.py; docs/scale.md).

    `revision` counts the transitions that changed what the planner reads of the fleet (a node registered, lost or
    back; its shards, engines, or a card's placement verdict; never readings alone, nor a card's free memory moving
    without crossing a threshold, nor a stream ending). `line` is a token shared by every registry transitions made
    from one constructed registry: two registries of one `line` with one `revision` offer the planner the same fleet
    (given `memory_thresholds` are the catalog's), which lets `llmgw.control.deciding.decide` reuse its last plan.
    """

    __slots__ = ("lost_after", "memory_thresholds", "max_inlet_celsius", "revision", "line", "_records", "_order",
                 "_expiry_floor")

    def __init__(self, lost_after: float, memory_thresholds: tuple[int, ...] = (),
                 records: Mapping[str, NodeRecord] | HashTrieMap | None = None, *, revision: int = 0,
                 line: object = None, _order: tuple[str, ...] | None = None, _expiry_floor: float | None = None,
                 max_inlet_celsius: float | None = None):
        self.lost_after = lost_after
        self.memory_thresholds = memory_thresholds
        self.max_inlet_celsius = max_inlet_celsius
        self.revision = revision
        self.line = line if line is not None else object()
        self._records: HashTrieMap = records if isinstance(records, HashTrieMap) else HashTrieMap(dict(records or {}))
        self._order: tuple[str, ...] = _order if _order is not None else tuple(sorted(self._records.keys()))
        self._expiry_floor = _expiry_floor

    def _with(self, node_id: str, record: NodeRecord, planning: bool) -> FleetRegistry:
        """This registry with `record` for `node_id`; `planning`: the planner's view of it changed."""
        order = self._order
        if node_id not in self._records:
            ids = list(order)
            insort(ids, node_id)
            order = tuple(ids)
        floor = self._expiry_floor
        if floor is not None and not record.lost:
            floor = min(floor, record.last_seen + self.lost_after)  # stays a lower bound (see `next_expiry`)
        return FleetRegistry(self.lost_after, self.memory_thresholds, self._records.insert(node_id, record),
                             revision=self.revision + planning, line=self.line, _order=order, _expiry_floor=floor,
                             max_inlet_celsius=self.max_inlet_celsius)

    def with_limits(self, lost_after: float, memory_thresholds: tuple[int, ...],
                    max_inlet_celsius: float | None = None) -> FleetRegistry:
        """The same records under another `lost_after` (seconds), catalog memory thresholds (bytes) and inlet limit
        (`serving.max_inlet_celsius`, degrees C; a node's verdict follows at its next heartbeat)."""
        if (lost_after == self.lost_after and memory_thresholds == self.memory_thresholds
                and max_inlet_celsius == self.max_inlet_celsius):
            return self
        return FleetRegistry(lost_after, memory_thresholds, self._records, revision=self.revision + 1,
                             line=self.line, _order=self._order, max_inlet_celsius=max_inlet_celsius)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, FleetRegistry) and self.lost_after == other.lost_after
                and self.memory_thresholds == other.memory_thresholds
                and self.max_inlet_celsius == other.max_inlet_celsius and self._records == other._records)

    __hash__ = None  # type: ignore[assignment]

    # -- reading ------------------------------------------------------------------------------------------

    def records(self) -> tuple[NodeRecord, ...]:
        """Every record, by node id."""
        records = self._records
        return tuple(records[k] for k in self._order)

    def get(self, node_id: str) -> NodeRecord | None:
        return self._records.get(node_id)

    def fleet(self) -> Fleet:
        """The fleet as the planner sees it: lost nodes with `alive=False` and no shards, by node id."""
        nodes = []
        for record in self.records():
            if record.lost:
                nodes.append(replace(record.state, alive=False, shards=()))
            else:
                nodes.append(replace(record.state, alive=True))
        return Fleet(nodes=tuple(nodes))

    # -- transitions --------------------------------------------------------------------------------------

    def register(
        self,
        node: NodeState,
        now: float,
        *,
        details: Mapping[str, ShardDetail] | None = None,
        os: str = "",
        arch: str = "",
        agent_version: str = "",
        warnings: Iterable[str] = (),
        engines_installable: Iterable[str] = (),
        features: Iterable[str] = (),
        health: NodeHealthReport | None = None,
        release_key: str = "",
    ) -> tuple[FleetRegistry, bool]:
        """A node (re)registered: record it as connected and alive with the shards it reports (adopted).

        `health` (else the node's last report, if any) is laid onto its cards at once, so a card a finding takes
        out is never offered between Register and the first heartbeat; the node's memory bandwidth is kept (its
        agent probes once per boot and says it in heartbeats, not in Register).
        Always placement-relevant (a new connection: its agent settings must be sent again, its GPUs judged anew).
        """
        old = self._records.get(node.node_id)
        if health is None and old is not None:
            health = old.health
        gpus, _ = apply_health(node.gpus, health)
        node, _ = with_interconnect(replace(node, alive=True, gpus=gpus), health)
        if node.memory_bandwidth is None and old is not None:  # Register carries none: its heartbeats do
            node = replace(node, memory_bandwidth=old.state.memory_bandwidth)
        record = NodeRecord(
            state=node,
            last_seen=now,
            connected=True,
            lost=False,
            os=os,
            arch=arch,
            agent_version=agent_version,
            warnings=tuple(warnings),
            details=MappingProxyType(dict(details or {})),
            registered_at=now,
            engines_installable=frozenset(engines_installable),
            features=frozenset(features),
            health=health,
            release_key=release_key,
        )
        return self._with(node.node_id, record, True), True

    def heartbeat(
        self,
        node_id: str,
        now: float,
        *,
        shards: Iterable[ObservedShard] | None = None,
        details: Mapping[str, ShardDetail] | None = None,
        engines_installed: Iterable[str] | None = None,
        engines_installing: Iterable[str] | None = None,
        readings: NodeReadings | None = None,
        health: NodeHealthReport | None = None,
        slurm_job_steps: int | None = None,
        slurm: Mapping[str, Any] | None = None,
        firewall: Mapping[str, str] | None = None,
        memory_bandwidth: MemoryBandwidth | None = None,
    ) -> tuple[FleetRegistry, bool]:
        """A heartbeat: the node is alive; `shards` (when given) is its full shard list now; `readings` replace
        the node's readings, advance its shards' speeds from their engines' counters, and update its cards' free
        memory and shared-card verdict; `health` replaces the node's health report and its cards' `unhealthy`;
        `slurm_job_steps` (when given) the Slurm job steps running there (a change is a change of the fleet: a
        reclaimed node opens when it reaches 0); `slurm` the node's Slurm report as plain data (None: it has none),
        kept for the status document; `firewall` likewise its firewall report (None: no table, nothing failed);
        `memory_bandwidth` the node's bandwidth probe (None: not in this beat, the node's last one is kept), in its
        state for plans and reviews to estimate CPU replicas' speed from, never placement-relevant.

        A heartbeat from a node that never registered is ignored (returns (self, False)): the agent registers first.
        """
        old = self._records.get(node_id)
        if old is None:
            return self, False
        state = old.state
        if shards is not None:
            shards = tuple(shards)
            if shards != state.shards:  # else the same tuple stays: readers compare shards by identity first
                state = replace(state, shards=shards)
        if engines_installed is not None:
            state = replace(state, engines_installed=frozenset(engines_installed))
        if engines_installing is not None:
            state = replace(state, engines_installing=frozenset(engines_installing))
        if memory_bandwidth is not None and memory_bandwidth != state.memory_bandwidth:
            state = replace(state, memory_bandwidth=memory_bandwidth)
        if slurm_job_steps is not None and slurm_job_steps != state.slurm_job_steps:
            state = replace(state, slurm_job_steps=slurm_job_steps)
        if readings is not None:
            hot = inlet_verdict(readings.sensors.inlet_celsius.value if readings.sensors.inlet_celsius else None,
                                self.max_inlet_celsius)
            if hot != state.inlet_too_hot:
                state = replace(state, inlet_too_hot=hot)
        gpus_changed = False
        if readings is not None and readings.gpus:
            gpus, gpus_changed = apply_gpu_readings(state.gpus, readings, self.memory_thresholds)
            if gpus != state.gpus:
                state = replace(state, gpus=gpus)
        health_changed = False
        if health is not None:
            gpus, health_changed = apply_health(state.gpus, health)
            if health_changed:
                state = replace(state, gpus=gpus)
            state, link_changed = with_interconnect(state, health)
            health_changed = health_changed or link_changed
        speeds = old.speeds
        if readings is not None and (old.speeds or any(s.engine is not None for s in readings.shards)):
            speeds = MappingProxyType(next_node_speeds(
                old.speeds, {s.shard_id: s.engine for s in readings.shards if s.engine is not None},
                readings.agent_time, (s.shard_id for s in state.shards)))
        record = replace(old, state=state, last_seen=now, lost=False, connected=True,
                         readings=readings if readings is not None else old.readings,
                         health=health if health is not None else old.health, slurm=slurm,
                         firewall=firewall, speeds=speeds)
        if details is not None:
            record = replace(record, details=MappingProxyType(dict(details)))
        changed = (
            old.lost
            or gpus_changed
            or health_changed
            or _shard_key(old.state.shards) != _shard_key(state.shards)
            or old.state.engines_installed != state.engines_installed
            or old.state.engines_installing != state.engines_installing
            or old.state.slurm_job_steps != state.slurm_job_steps
            or old.state.inlet_too_hot != state.inlet_too_hot
        )
        planning = (changed or old.state.shards != state.shards
                    or old.state.memory_bandwidth is not state.memory_bandwidth)
        return self._with(node_id, record, planning), changed

    def shard_status(
        self, node_id: str, shard: ObservedShard, now: float, detail: ShardDetail | None = None,
    ) -> tuple[FleetRegistry, bool]:
        """One shard changed state: replace it in the node's list (or add it). Unknown node: ignored."""
        old = self._records.get(node_id)
        if old is None:
            return self, False
        shards = [s for s in old.state.shards if s.shard_id != shard.shard_id]
        shards.append(shard)
        shards.sort(key=lambda s: s.shard_id)
        details = dict(old.details)
        if detail is not None:
            details[shard.shard_id] = detail
        record = replace(
            old, state=replace(old.state, shards=tuple(shards)), last_seen=now, lost=False, connected=True,
            details=MappingProxyType(details),
        )
        changed = old.lost or _shard_key(old.state.shards) != _shard_key(record.state.shards)
        return self._with(node_id, record, changed or old.state.shards != record.state.shards), changed

    def engine_status(self, node_id: str, engine: str, state: EngineState, error: str,
                      now: float) -> tuple[FleetRegistry, bool]:
        """An engine install progressed: INSTALLING, INSTALLED or FAILED (with `error`)."""
        old = self._records.get(node_id)
        if old is None:
            return self, False
        installed = set(old.state.engines_installed)
        installing = set(old.state.engines_installing)
        errors = dict(old.engine_errors)
        installing.discard(engine)
        errors.pop(engine, None)
        if state is EngineState.INSTALLING:
            installing.add(engine)
        elif state is EngineState.INSTALLED:
            installed.add(engine)
        else:
            errors[engine] = error or "failed without a reason"
        state_value = replace(old.state, engines_installed=frozenset(installed), engines_installing=frozenset(installing))
        record = replace(
            old, state=state_value, last_seen=now, lost=False, connected=True, engine_errors=MappingProxyType(errors)
        )
        changed = state_value != old.state or old.lost
        return self._with(node_id, record, changed), changed

    def disconnect(self, node_id: str, now: float) -> tuple[FleetRegistry, bool]:
        """The node's stream ended. It stays alive until `lost_after` has passed since it was last heard from."""
        old = self._records.get(node_id)
        if old is None or not old.connected:
            return self, False
        return self._with(node_id, replace(old, connected=False), False), False

    def without(self, node_id: str) -> tuple[FleetRegistry, bool]:
        """The node forgotten (`llmgw node remove`): its record gone, as if it never registered. Placement-relevant
        when it was there; an unknown node: (self, False)."""
        if node_id not in self._records:
            return self, False
        return FleetRegistry(self.lost_after, self.memory_thresholds, self._records.remove(node_id),
                             revision=self.revision + 1, line=self.line,
                             _order=tuple(n for n in self._order if n != node_id)), True

    def expire(self, now: float) -> tuple[FleetRegistry, tuple[str, ...]]:
        """Mark nodes silent for `lost_after` seconds or longer as lost; return (registry, ids newly lost).

        Before `next_expiry()` this looks at no node and returns `(self, ())`. At exactly the quietest node's last
        message + `lost_after` that node is lost, so a loop that sleeps until `next_expiry()` always makes progress."""
        if now < self._floor():
            return self, ()
        lost = [node_id for node_id, r in self._records.items() if not r.lost and now >= r.last_seen + self.lost_after]
        if not lost:
            self._expiry_floor = None  # a node that was the quietest spoke since: look again (a cache, not a value)
            return self, ()
        records = self._records
        for node_id in lost:
            records = records.insert(node_id, replace(records[node_id], lost=True, connected=False))
        registry = FleetRegistry(self.lost_after, self.memory_thresholds, records, revision=self.revision + 1,
                                 line=self.line, _order=self._order, max_inlet_celsius=self.max_inlet_celsius)
        return registry, tuple(sorted(lost))

    def next_expiry(self) -> float | None:
        """No later than the time the next node would become lost if it stays silent; None when none can.

        Exact on a registry built from records and after an `expire` that found nobody lost; in between it may be
        earlier than the truth (the quietest node has spoken since), never later, since heartbeats only move a
        node's expiry forward. O(1), except the first call on a registry built from records or just expired."""
        floor = self._floor()
        return None if floor == math.inf else floor

    def _floor(self) -> float:
        floor = self._expiry_floor
        if floor is None:
            times = [r.last_seen + self.lost_after for r in self._records.values() if not r.lost]
            floor = self._expiry_floor = min(times) if times else math.inf
        return floor

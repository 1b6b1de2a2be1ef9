"""Agents' reports (Register, Heartbeat, ShardStatus messages of llmgw/wire/agent.proto) as plan data.

Pure conversions: a pb message in, `NodeState` / `ObservedShard` / `ShardDetail` values out. The messages are
read by field name only, so anything with the same attributes converts the same way.
Units follow agent.proto: bytes, seconds; an unset `optional` field means "not measured".
A Register whose address is not an IP literal or an RFC 1123 host name is refused (`check_register`, WireError):
the address goes into the Slurm files every node reads.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import replace

from llmgw.control.readings import GpuSample, NodeReadings, ShardReading
from llmgw.control.registry import ShardDetail
from llmgw.errors import WireError
from llmgw.identity import ShardState
from llmgw.plan.types import Fleet, GpuState, MemoryBandwidth, NodeState, ObservedShard
from llmgw.settings.model import Settings
from llmgw.tools.engine_metrics import LOAD_FIELDS, EngineLoad
from llmgw.tools.sensors import NodeSensors, SensorValue

_STATES = {s.value: s for s in ShardState}


def _has(message, name: str) -> bool:
    try:
        return message.HasField(name)
    except (ValueError, AttributeError):
        return getattr(message, name, None) is not None


def shard_from_status(status) -> ObservedShard:
    """An `ObservedShard` from a pb `ShardStatus`. An unknown state string becomes FAILED, saying so in `error`."""
    state = _STATES.get(status.state)
    error = status.error
    if state is None:
        state = ShardState.FAILED
        error = error or f"the agent reported an unknown state {status.state!r}"
    return ObservedShard(
        shard_id=status.shard_id,
        replica_id=status.replica_id,
        model=status.model,
        state=state,
        fingerprint=status.fingerprint,
        settings_commit=status.settings_commit,
        devices=tuple(status.devices),
        cpu_cores=float(status.cpu_cores),
        memory_bytes=int(status.memory_bytes),
        port=int(status.port),
        error=error,
        restarts=int(status.restarts),
        adopted_foreign=bool(status.foreign),
        rank=int(status.rank),
        group=status.group,
    )


def detail_from_status(status) -> ShardDetail:
    """The parts of a pb `ShardStatus` the planner does not use (pid, progress, log tail)."""
    return ShardDetail(
        pid=int(status.pid),
        progress=float(status.progress) if _has(status, "progress") else None,
        progress_text=status.progress_text,
        last_log_lines=tuple(status.last_log_lines),
        adopted=bool(status.adopted),
    )


def convert_shards(statuses: Iterable) -> tuple[tuple[ObservedShard, ...], dict[str, ShardDetail]]:
    """pb `ShardStatus` values as (shards by shard id, details by shard id).

    Engine processes llmgw did not start are included with `adopted_foreign=True`: the planner counts what
    they hold and never stops them; routing never uses them.
    """
    shards, details = [], {}
    for status in statuses:
        shard = shard_from_status(status)
        shards.append(shard)
        details[shard.shard_id] = detail_from_status(status)
    return tuple(sorted(shards, key=lambda s: s.shard_id)), details


def _optional(message, name: str):
    return getattr(message, name) if _has(message, name) else None


_GPU_READINGS = tuple(f for f in GpuSample.__dataclass_fields__ if f not in ("index", "foreign_pids"))


def bandwidth_from_heartbeat(beat) -> MemoryBandwidth | None:
    """A pb Heartbeat's `memory_bandwidth` (None when it carries none)."""
    if not beat.HasField("memory_bandwidth"):
        return None
    probe = beat.memory_bandwidth
    return MemoryBandwidth(probe.one_core_bytes_per_second, probe.all_cores_bytes_per_second, probe.threads,
                           probe.seconds)


def readings_from_heartbeat(beat, now: float) -> NodeReadings:
    """The readings of a pb `Heartbeat` that arrived at `now` (control-plane clock seconds); unset fields are None.

    The agent reads every `telemetry_interval` and each beat carries the latest reading, taken at `sampled_at`
    (unix seconds at the agent): the readings' time is moved back by how much older than the beat they are."""
    gpus = tuple(
        GpuSample(index=int(g.index), foreign_pids=tuple(int(p) for p in g.foreign_pids),
                   **{name: _optional(g, name) for name in _GPU_READINGS})
        for g in beat.gpus
    )
    shards = tuple(
        ShardReading(s.shard_id, _optional(s, "cpu_cores_used"), _optional(s, "resident_memory_bytes"),
                     _engine_load(s.engine) if _has(s, "engine") else None)
        for s in beat.shards
    )
    taken = float(beat.sampled_at) if _has(beat, "sampled_at") else float(beat.time)
    return NodeReadings(
        at=now - max(0.0, float(beat.time) - taken), agent_time=taken, cpu_percent=_optional(beat, "cpu_percent"),
        load1=_optional(beat, "load1"), memory_used_bytes=_optional(beat, "memory_used_bytes"),
        memory_available_bytes=_optional(beat, "memory_available_bytes"),
        disk_free_bytes=_optional(beat, "disk_free_bytes"), gpus=gpus, shards=shards,
        sensors=sensors_from_message(beat.sensors) if _has(beat, "sensors") else NodeSensors(),
    )


def _sensor(value) -> SensorValue:
    return SensorValue(value.sensor, value.label, float(value.value))


def sensors_from_message(message) -> NodeSensors:
    """The `NodeSensors` of a pb `NodeSensors` (an unset inlet: None)."""
    return NodeSensors(tuple(_sensor(v) for v in message.cpu_package_celsius),
                       tuple(_sensor(v) for v in message.cpu_package_watts),
                       _sensor(message.inlet_celsius) if message.HasField("inlet_celsius") else None)


def _engine_load(load) -> EngineLoad:
    """An `EngineLoad` from a pb `EngineLoad` (unset fields: None)."""
    return EngineLoad(**{name: _optional(load, name) for name in LOAD_FIELDS})


def memory_thresholds(settings: Settings | None) -> tuple[int, ...]:
    """The per-GPU memory (bytes) each GPU model of the catalog needs, sorted and without repeats: a card whose
    free memory crosses one of these may now take, or no longer take, a replica (placement-relevant)."""
    if settings is None:
        return ()
    from llmgw.plan import demand_of

    needs = set()
    for model in settings.models.values():
        demand = demand_of(settings, model)
        if demand.gpus and demand.gpu_memory:
            needs.add(int(demand.gpu_memory))
    return tuple(sorted(needs))


def gpu_from_report(gpu) -> GpuState:
    """A placeable device from a pb `Gpu`: free memory is `memory_free_bytes`, else total less used, else total."""
    total = int(gpu.memory_total_bytes)
    if _has(gpu, "memory_free_bytes"):
        free = int(gpu.memory_free_bytes)
    elif _has(gpu, "memory_used_bytes"):
        free = max(0, total - int(gpu.memory_used_bytes))
    else:
        free = total
    return GpuState(
        device_id=gpu.device_id or str(gpu.index),
        gpu_class=gpu.gpu_class,
        memory_total_bytes=total,
        memory_free_bytes=free,
        uuid=gpu.uuid,
        foreign_processes=bool(len(gpu.foreign_pids)),
        is_mig=bool(gpu.is_mig_instance),
        numa_node=int(gpu.numa_node) if _has(gpu, "numa_node") else None,
        nvlink_peers=tuple(gpu.nvlink_peers),
        parent_uuid=gpu.parent_uuid if gpu.is_mig_instance else "",
    )


_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def address_problem(address: str) -> str | None:
    """Why `address` cannot be a node's address, or None when it can.

    A node's address is an IP literal (IPv4 dotted quad, or IPv6 without a zone such as `%eth0`) or an RFC 1123
    host name: dot-separated labels of 1..63 letters, digits and hyphens, neither starting nor ending with a hyphen,
    253 characters at most, the last label not all digits (RFC 1123 2.1, RFC 3696 2: "10.0.0.300" is no name).
    Anything else (spaces, newlines, `=`, `#`, a trailing dot, brackets, a port) is refused: the address is written
    into slurm.conf (`NodeAddr=`) and other generated files that every node reads. Pure.
    """
    try:
        literal = ipaddress.ip_address(address)
    except ValueError:
        literal = None
    if literal is not None:
        return "an IPv6 address with a zone (%...) is not accepted" if "%" in address else None
    labels = address.split(".")
    if not address or len(address) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return "it is neither an IP address nor a host name (RFC 1123: letters, digits, hyphens and dots)"
    if labels[-1].isdigit():
        return "it looks like an IPv4 address but is not one"
    return None


def check_register(register, peer_host: str = "127.0.0.1") -> None:
    """Refuse a pb `Register` whose node may not join: its address (the reported one, else `peer_host`) is not an IP
    literal or host name (`address_problem`). Pure.

    Raises: WireError with a sentence for the agent: what is wrong and what to do. The control plane ends the
    agent's stream with it, so the node is never recorded.
    """
    address = register.address or peer_host
    problem = address_problem(address)
    if problem is not None:
        raise WireError(f"node {register.node_id!r} reported the address {address!r}, which is refused: {problem}. "
                        "Set the agent's address to the node's IP address or host name (llmgw agent --address).")


def node_from_register(register, peer_host: str = "127.0.0.1") -> NodeState:
    """A `NodeState` from a pb `Register`, with the shards it runs now (to be adopted).

    A GPU with MIG enabled is not itself placeable: its MIG instances are (reported as their own `Gpu`
    entries with `is_mig_instance`). `address` is the reported address, else the peer's host.
    Raises: WireError (`check_register`) for an address that is not an IP literal or host name: such a node
    never joins.
    """
    check_register(register, peer_host)
    shards, _details = convert_shards(register.shards)
    gpus = tuple(
        gpu_from_report(g) for g in register.gpus if g.is_mig_instance or not g.mig_enabled
    )
    return NodeState(
        node_id=register.node_id,
        address=register.address or peer_host,
        alive=True,
        labels=tuple(sorted(dict(register.labels).items())),
        cpu_cores=float(register.cpu_cores),
        memory_bytes=int(register.memory_total_bytes),
        gpus=gpus,
        engines_installed=frozenset(register.engines_installed),
        shards=shards,
    )


def settings_view(node: NodeState, settings: Settings) -> dict:
    """What the settings change of `node` (fields for `dataclasses.replace`): its labels from its agent settings
    laid over the reported ones, and its CPU cores and memory less what its agent settings reserve. GPUs its agent
    settings ignore stay listed: the planner leaves them out and says so ("1 ignored by agent settings")."""
    agent = settings.agent_settings_for(node.node_id)
    changes: dict = {}
    if agent.labels:
        labels = dict(node.labels)
        labels.update(agent.labels)
        changes["labels"] = tuple(sorted(labels.items()))
    if agent.cpu_cores_reserved:
        changes["cpu_cores"] = max(0.0, node.cpu_cores - agent.cpu_cores_reserved)
    if agent.memory_reserved_bytes:
        changes["memory_bytes"] = max(0, node.memory_bytes - agent.memory_reserved_bytes)
    return changes


def fleet_for(fleet: Fleet, settings: Settings | None) -> Fleet:
    """The fleet as the settings see it (`settings_view` of every node); `fleet` itself when `settings` is None."""
    if settings is None:
        return fleet
    return Fleet(nodes=tuple(replace(node, **settings_view(node, settings)) for node in fleet.nodes))


def capacity_view(fleet: Fleet, settings: Settings | None) -> Fleet:
    """`fleet_for`, with the GPUs each node's agent settings ignore left out too: what the fleet can offer, for
    headroom figures (`llmgw review`). The planner itself takes `fleet_for`, so it can say a card is ignored."""
    view = fleet_for(fleet, settings)
    if settings is None:
        return view
    nodes = []
    for node in view.nodes:
        ignore = set(settings.agent_settings_for(node.node_id).ignore_gpus)
        nodes.append(replace(node, gpus=tuple(g for g in node.gpus if not ({g.device_id, g.uuid} & ignore))))
    return Fleet(nodes=tuple(nodes))

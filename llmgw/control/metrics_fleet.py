"""The fleet as Prometheus metric families: nodes, their last readings, GPUs, shards and replicas.

Pure: `fleet_families(fleet, settings, now)` turns one immutable snapshot into prometheus_client metric families
(plain data) at scrape time; nothing is kept between scrapes. Readings older than `READING_MAX_AGE` (60 s) are
absent, never repeated (as in `NodeReadings.to_json`); a reading the agent could not take is absent too, never 0.

Units are Prometheus base units: bytes, seconds, watts, Celsius, hertz, ratios 0-1 (the wire's percents / 100).
Labels are bounded and never chosen by a client: `node` (node ids of registered agents), `gpu` (the card's index
on its node), `gpu_class`, `model` / `replica` / `shard` (names from the settings catalog, as agents report them),
`state` and `reason` (fixed enumerations). The names are listed in docs/observability.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from llmgw.control.metrics_engines import engine_families
from llmgw.control.metrics_health import health_families
from llmgw.control.readings import NodeReadings
from llmgw.control.registry import FleetRegistry, NodeRecord
from llmgw.identity import ShardState
from llmgw.settings.model import Settings
from llmgw.tools.nvidia_smi import CLOCK_EVENT_BITS

NODE_STATES = ("connected", "disconnected", "lost")
"""A node's state as /metrics counts it: connected (stream up), disconnected (stream down, not yet lost), lost."""

NODE = ["node"]
GPU = ["node", "gpu", "gpu_class"]
SHARD = ["node", "model", "replica", "shard"]


def node_state(record: NodeRecord) -> str:
    """One of NODE_STATES for `record`."""
    if record.lost:
        return "lost"
    return "connected" if record.connected else "disconnected"


def fleet_families(fleet: FleetRegistry, settings: Settings | None, now: float,
                   wanted: Mapping[str, int] = MappingProxyType({})) -> list[Metric]:
    """Every fleet metric family of `fleet` at `now` (control-plane clock seconds, as `NodeReadings.at`).

    `settings` (None before any commit validated) gives the catalog's desired replicas per model; `wanted` the
    autoscaler's count of the models whose catalog file gives a range (`llmgw.control.autoscaling`), which is then
    the model's desired count. Families with
    no sample are still returned (with HELP and TYPE), so a scrape always names them.
    """
    records = fleet.records()
    out: list[Metric] = []
    nodes = GaugeMetricFamily("llmgw_nodes", "Nodes by state (connected, disconnected, lost).", labels=["state"])
    for state in NODE_STATES:
        nodes.add_metric([state], sum(1 for r in records if node_state(r) == state))
    out.append(nodes)
    up = GaugeMetricFamily("llmgw_node_up", "1 while the node is connected or heard from lately, 0 once lost.",
                           labels=NODE)
    info = GaugeMetricFamily("llmgw_node_info", "Always 1: the node's agent version, OS and architecture.",
                             labels=["node", "agent_version", "os", "arch"])
    cores = GaugeMetricFamily("llmgw_node_cpu_cores", "CPU cores placement may use (total less reserved).",
                              labels=NODE)
    memory = GaugeMetricFamily("llmgw_node_memory_bytes", "Memory placement may use (total less reserved), bytes.",
                               labels=NODE)
    for record in records:
        up.add_metric([record.node_id], 0.0 if record.lost else 1.0)
        info.add_metric([record.node_id, record.agent_version, record.os, record.arch], 1.0)
        cores.add_metric([record.node_id], record.state.cpu_cores)
        memory.add_metric([record.node_id], record.state.memory_bytes)
    out += [up, info, cores, memory]
    fresh = [(r, r.readings) for r in records if r.readings is not None and r.readings.fresh(now)]
    out += list(_node_readings(fresh, now))
    out += list(_sensors(fresh))
    out += list(_gpus(fresh))
    out += list(health_families(records))
    out += list(_shards(records, fresh))
    out += list(engine_families(fresh))
    out += list(_replicas(records, settings, wanted))
    return out


def _node_readings(fresh: list[tuple[NodeRecord, NodeReadings]], now: float) -> Iterator[Metric]:
    specs = [
        ("llmgw_node_cpu_usage_ratio", "CPU use of all cores over the last heartbeat period, 0-1.",
         lambda r: None if r.cpu_percent is None else r.cpu_percent / 100.0),
        ("llmgw_node_load1", "1-minute load average.", lambda r: r.load1),
        ("llmgw_node_memory_used_bytes", "Memory in use, bytes.", lambda r: r.memory_used_bytes),
        ("llmgw_node_memory_available_bytes", "Memory available for new processes, bytes.",
         lambda r: r.memory_available_bytes),
        ("llmgw_node_disk_free_bytes", "Free space under the weights directory, bytes.", lambda r: r.disk_free_bytes),
    ]
    age = GaugeMetricFamily("llmgw_node_readings_age_seconds", "Seconds since the node's last readings arrived "
                            "(absent once older than 60 s).", labels=NODE)
    for record, readings in fresh:
        age.add_metric([record.node_id], readings.age(now))
    yield age
    for name, text, value in specs:
        family = GaugeMetricFamily(name, text, labels=NODE)
        for record, readings in fresh:
            got = value(readings)
            if got is not None:
                family.add_metric([record.node_id], float(got))
        yield family


def _sensors(fresh: list[tuple[NodeRecord, NodeReadings]]) -> Iterator[Metric]:
    """The machine room's sensors: one sample per CPU package (its hwmon chip, "coretemp.0") and RAPL package zone
    ("package-0"), one inlet per node; a sensor the node did not measure has no sample (never 0)."""
    temperature = GaugeMetricFamily("llmgw_node_cpu_package_temperature_celsius", "CPU package temperature (hwmon "
                                    "coretemp / k10temp), degrees Celsius.", labels=["node", "sensor"])
    power = GaugeMetricFamily("llmgw_node_cpu_package_power_watts", "CPU package power (RAPL energy counter over the "
                              "last reading period), watts.", labels=["node", "zone"])
    inlet = GaugeMetricFamily("llmgw_node_inlet_temperature_celsius", "The board's inlet temperature (hwmon input "
                              "labelled inlet, ambient or SYSTIN), degrees Celsius.", labels=NODE)
    for record, readings in fresh:
        sensors = readings.sensors
        for value in sensors.cpu_package_celsius:
            temperature.add_metric([record.node_id, value.sensor], value.value)
        for value in sensors.cpu_package_watts:
            power.add_metric([record.node_id, value.sensor], value.value)
        if sensors.inlet_celsius is not None:
            inlet.add_metric([record.node_id], sensors.inlet_celsius.value)
    yield from (temperature, power, inlet)


def _ratio(percent: float | None) -> float | None:
    return None if percent is None else percent / 100.0


def _gpus(fresh: list[tuple[NodeRecord, NodeReadings]]) -> Iterator[Metric]:
    gauges = [
        ("llmgw_gpu_utilization_ratio", "Share of the last period a kernel ran on the GPU, 0-1.",
         lambda g, d: _ratio(g.utilization_percent)),
        ("llmgw_gpu_memory_used_bytes", "GPU memory in use, bytes.", lambda g, d: g.memory_used_bytes),
        ("llmgw_gpu_memory_total_bytes", "GPU memory, bytes.", lambda g, d: d.memory_total_bytes if d else None),
        ("llmgw_gpu_power_watts", "Power draw, watts.", lambda g, d: g.power_draw_watts),
        ("llmgw_gpu_power_limit_watts", "Enforced power limit, watts.", lambda g, d: g.power_limit_watts),
        ("llmgw_gpu_temperature_celsius", "GPU temperature, degrees Celsius.", lambda g, d: g.temperature_celsius),
        ("llmgw_gpu_memory_temperature_celsius", "GPU memory (HBM) temperature where the card measures it, degrees "
         "Celsius.", lambda g, d: g.memory_temperature_celsius),
        ("llmgw_gpu_sm_clock_hertz", "SM clock, hertz.",
         lambda g, d: None if g.sm_clock_mhz is None else g.sm_clock_mhz * 1e6),
        ("llmgw_gpu_sm_active_ratio", "GPM: share of SM cycles with a warp resident, 0-1 (Hopper and newer).",
         lambda g, d: _ratio(g.sm_active_percent)),
        ("llmgw_gpu_sm_occupancy_ratio", "GPM: warps resident over the SMs' maximum, 0-1 (Hopper and newer).",
         lambda g, d: _ratio(g.sm_occupancy_percent)),
        ("llmgw_gpu_tensor_active_ratio", "GPM: share of cycles the tensor cores were busy, 0-1 (Hopper and newer).",
         lambda g, d: _ratio(g.tensor_active_percent)),
        ("llmgw_gpu_dram_active_ratio", "GPM: DRAM bandwidth used over its peak, 0-1 (Hopper and newer).",
         lambda g, d: _ratio(g.dram_bandwidth_percent)),
        ("llmgw_gpu_foreign_processes", "Processes llmgw did not start that hold the GPU now.",
         lambda g, d: len(g.foreign_pids)),
    ]
    cards = []
    for record, readings in fresh:
        for gpu in readings.gpus:
            device = next((d for d in record.state.gpus if not d.is_mig and d.device_id == str(gpu.index)), None)
            cards.append(([record.node_id, str(gpu.index), device.gpu_class if device else ""], gpu, device))
    for name, text, value in gauges:
        family = GaugeMetricFamily(name, text, labels=GPU)
        for labels, gpu, device in cards:
            got = value(gpu, device)
            if got is not None:
                family.add_metric(labels, float(got))
        yield family
    ecc = CounterMetricFamily("llmgw_gpu_ecc_uncorrected_errors", "Volatile uncorrected ECC errors since the "
                              "driver loaded.", labels=GPU)
    events = GaugeMetricFamily("llmgw_gpu_clock_event_active", "1 while NVML reports this clock event reason "
                               "(nvmlClocksEventReason*), else 0.", labels=[*GPU, "reason"])
    for labels, gpu, _device in cards:
        if gpu.ecc_uncorrected is not None:
            ecc.add_metric(labels, float(gpu.ecc_uncorrected))
        if gpu.clock_event_reasons is not None:
            for reason, bit in CLOCK_EVENT_BITS.items():
                events.add_metric([*labels, reason], 1.0 if gpu.clock_event_reasons & bit else 0.0)
    yield ecc
    yield events


def _shards(records: tuple[NodeRecord, ...], fresh: list[tuple[NodeRecord, NodeReadings]]) -> Iterator[Metric]:
    state = GaugeMetricFamily("llmgw_shard_state", "1 for the shard's current state, 0 for the others.",
                              labels=[*SHARD, "state"])
    restarts = CounterMetricFamily("llmgw_shard_restarts", "Times the agent restarted the shard's engine.",
                                   labels=SHARD)
    for record in records:
        if record.lost:
            continue
        for shard in record.state.shards:
            labels = [record.node_id, shard.model, shard.replica_id, shard.shard_id]
            for each in ShardState:
                state.add_metric([*labels, each.value], 1.0 if shard.state is each else 0.0)
            restarts.add_metric(labels, float(shard.restarts))
    yield state
    yield restarts
    cores = GaugeMetricFamily("llmgw_shard_cpu_cores_used", "CPU cores the shard's processes used over the last "
                              "heartbeat period.", labels=SHARD)
    resident = GaugeMetricFamily("llmgw_shard_resident_memory_bytes", "Resident memory of the shard's processes, "
                                 "bytes.", labels=SHARD)
    for record, readings in fresh:
        shards = {s.shard_id: s for s in record.state.shards}
        for reading in readings.shards:
            shard = shards.get(reading.shard_id)
            if shard is None:
                continue
            labels = [record.node_id, shard.model, shard.replica_id, shard.shard_id]
            if reading.cpu_cores_used is not None:
                cores.add_metric(labels, reading.cpu_cores_used)
            if reading.resident_memory_bytes is not None:
                resident.add_metric(labels, float(reading.resident_memory_bytes))
    yield cores
    yield resident


def _replicas(records: tuple[NodeRecord, ...], settings: Settings | None,
              wanted: Mapping[str, int]) -> Iterator[Metric]:
    """Per model: replicas the catalog (or for an autoscaled model, the autoscaler) asks for, and replicas whose
    every shard is ready on a live node."""
    shards: dict[tuple[str, str], list[bool]] = {}
    for record in records:
        if record.lost:
            continue
        for shard in record.state.shards:
            if not shard.adopted_foreign:
                shards.setdefault((shard.model, shard.replica_id), []).append(shard.state is ShardState.READY)
    ready: dict[str, int] = {}
    for (model, _replica), states in shards.items():
        ready[model] = ready.get(model, 0) + (1 if all(states) else 0)
    desired = GaugeMetricFamily("llmgw_model_replicas_desired", "Replicas the settings in force ask for (models "
                                "served by llmgw, not external endpoints); for a model with a replicas range, the "
                                "count the autoscaler wants.", labels=["model"])
    running = GaugeMetricFamily("llmgw_model_replicas_ready", "Replicas whose every shard is ready on a live node.",
                                labels=["model"])
    models = {}
    if settings is not None:
        models = {name: wanted.get(name, m.replicas) for name, m in settings.models.items() if not m.endpoints}
    for name in sorted(set(models) | set(ready)):
        if name in models:
            desired.add_metric([name], float(models[name]))
        running.add_metric([name], float(ready.get(name, 0)))
    yield desired
    yield running

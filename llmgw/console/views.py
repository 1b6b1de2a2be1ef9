"""What each console page shows, as plain data built from one `ControlState` (pure: no trio, no I/O, no clock).

`now` is the control plane's clock (`trio.current_time()`, the clock of `NodeReadings.at`); readings older than
`READING_MAX_AGE` are shown as absent, never as current. Load classes (`load_class`) are what the stylesheet
colours: "load-idle" under 10 %, "load-low" under 40 %, "load-mid" under 70 %, "load-high" from 70 %, and
"load-unknown" when nothing was read.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from llmgw.control.view import (
    ControlState, GpuSample, NodeRecord, measured_speeds, state_document, upgrade_document,
)

LOAD_CLASSES = ((10.0, "load-idle"), (40.0, "load-low"), (70.0, "load-mid"))
MAP_COLOURINGS = ("utilization", "memory", "power")
"""What the GPU map may be coloured by (`GpuTile.percent`)."""


def load_class(percent: float | None) -> str:
    """The CSS class of a load in percent (0-100); None (not read) is "load-unknown"."""
    if percent is None:
        return "load-unknown"
    for limit, name in LOAD_CLASSES:
        if percent < limit:
            return name
    return "load-high"


def ratio(part: float | None, whole: float | None) -> float | None:
    """part / whole clamped to 0..1, None when either is unknown or whole is 0."""
    if part is None or not whole:
        return None
    return max(0.0, min(1.0, part / whole))


def node_state(record: NodeRecord) -> str:
    return "lost" if record.lost else ("connected" if record.connected else "disconnected")


@dataclass(frozen=True)
class GpuTile:
    """One card as the node page and the GPU map show it. Memory in bytes, power in watts; None: not read."""

    node_id: str
    index: int
    device_id: str
    gpu_class: str
    memory_total_bytes: int
    utilization_percent: float | None
    memory_used_bytes: int | None
    power_draw_watts: float | None
    power_limit_watts: float | None
    temperature_celsius: float | None
    foreign: bool
    mig: bool = False
    memory_temperature_celsius: float | None = None
    unhealthy: str = ""

    @property
    def load(self) -> str:
        return load_class(self.utilization_percent)

    def percent(self, by: str) -> float | None:
        """The tile's value in percent for the map coloured `by` "utilization", "memory" (used against total)
        or "power" (draw against limit); None when not read."""
        if by == "memory":
            r = self.memory_ratio
        elif by == "power":
            r = self.power_ratio
        else:
            return self.utilization_percent
        return None if r is None else 100.0 * r

    @property
    def memory_ratio(self) -> float | None:
        return ratio(self.memory_used_bytes, self.memory_total_bytes)

    @property
    def power_ratio(self) -> float | None:
        return ratio(self.power_draw_watts, self.power_limit_watts)


def gpu_tiles(record: NodeRecord, now: float) -> list[GpuTile]:
    """Every placeable GPU of a node, whole cards with their fresh readings (Nones when stale or absent).

    A card with MIG enabled is not in the fleet state, only its MIG instances (`is_mig`), and the registry keeps no
    instance's parent card: each instance is its own tile, under its MIG class, without readings (NVML reads per
    card). `index` is the card's index, or the instance's position among the node's GPUs.
    """
    readings = record.readings if record.readings is not None and record.readings.fresh(now) else None
    by_index: dict[str, GpuSample] = {str(g.index): g for g in (readings.gpus if readings else ())}
    tiles = []
    for position, gpu in enumerate(record.state.gpus):
        reading = None if gpu.is_mig else by_index.get(gpu.device_id)
        index = int(gpu.device_id) if gpu.device_id.isdigit() else position
        tiles.append(GpuTile(
            node_id=record.node_id, index=index, device_id=gpu.device_id, gpu_class=gpu.gpu_class,
            memory_total_bytes=gpu.memory_total_bytes,
            utilization_percent=reading.utilization_percent if reading else None,
            memory_used_bytes=reading.memory_used_bytes if reading else None,
            power_draw_watts=reading.power_draw_watts if reading else None,
            power_limit_watts=reading.power_limit_watts if reading else None,
            temperature_celsius=reading.temperature_celsius if reading else None,
            foreign=gpu.foreign_processes, mig=gpu.is_mig,
            memory_temperature_celsius=reading.memory_temperature_celsius if reading else None,
            unhealthy=gpu.unhealthy,
        ))
    return tiles


def card_verdicts(record: NodeRecord) -> dict[str, Any]:
    """{device id of a whole card ("0"): its `CardVerdict`} from the node's last health report (level, findings with
    their message and source, placeable); {} before the agent sent one."""
    if record.health is None:
        return {}
    return {str(verdict.index): verdict for verdict in record.health.health.cards}


@dataclass(frozen=True)
class NodeRow:
    """One node of the nodes table. Ratios 0..1 (None: not read); `gpu_load` the mean card utilisation."""

    node_id: str
    state: str
    address: str
    agent_version: str
    cpu_cores: float
    cpu_ratio: float | None
    memory_bytes: int
    memory_ratio: float | None
    gpus: int
    gpu_load: float | None
    warnings: tuple[str, ...]
    engines: tuple[str, ...]
    engines_installing: tuple[str, ...]
    engine_errors: tuple[tuple[str, str], ...]
    readings_age: float | None
    shards: int


def node_row(record: NodeRecord, now: float) -> NodeRow:
    readings = record.readings if record.readings is not None and record.readings.fresh(now) else None
    memory_ratio = None
    if readings is not None and readings.memory_used_bytes is not None:
        total = readings.memory_used_bytes + (readings.memory_available_bytes or 0)
        memory_ratio = ratio(readings.memory_used_bytes, total)
    loads = [g.utilization_percent for g in (readings.gpus if readings else ()) if g.utilization_percent is not None]
    node = record.state
    return NodeRow(
        node_id=record.node_id, state=node_state(record), address=node.address, agent_version=record.agent_version,
        cpu_cores=node.cpu_cores, cpu_ratio=ratio(readings.cpu_percent, 100.0) if readings else None,
        memory_bytes=node.memory_bytes, memory_ratio=memory_ratio, gpus=sum(1 for g in node.gpus if not g.is_mig),
        gpu_load=sum(loads) / len(loads) if loads else None, warnings=record.warnings,
        engines=tuple(sorted(node.engines_installed)), engines_installing=tuple(sorted(node.engines_installing)),
        engine_errors=tuple(sorted(record.engine_errors.items())),
        readings_age=readings.age(now) if readings else None, shards=len(node.shards),
    )


def cluster_view(state: ControlState) -> dict[str, Any]:
    """The cluster page: the status document plus counts of nodes and replicas by state, and the last `llmgw
    upgrade` rollout (`upgrade_document`, its times left out: they are on the control plane's clock; None: none)."""
    doc = state_document(state)
    return {
        "status": doc,
        "upgrade": upgrade_document(state.upgrade) if state.upgrade is not None else None,
        "node_states": dict(sorted(Counter(n["state"] for n in doc["nodes"].values()).items())),
        "replica_states": dict(sorted(Counter(r["state"] for r in doc["replicas"].values()).items())),
    }


def models_view(state: ControlState, wall: float) -> dict[str, dict[str, Any]]:
    """Per model of the settings in force (and any model still running): wanted and ready replica counts, its
    replicas from the status document (each measured one with its `speed` from its engine's counters, its age at
    `wall`, unix seconds), and what the console's actions change: its fixed `count` or autoscaled range (`low`,
    `high`), its adapters' names, and `in_catalog` (False: a model still running that the catalog dropped)."""
    speeds = measured_speeds(state, wall)
    replicas = {rid: {**r, "speed": speeds[rid]} if rid in speeds else r
                for rid, r in state_document(state)["replicas"].items()}
    models: dict[str, dict[str, Any]] = {}
    settings = state.settings
    for model in (settings.models if settings else {}).values():
        scaling = model.scaling
        models[model.name] = {"wanted": model.replicas, "ready": 0, "replicas": {}, "in_catalog": True,
                              "count": None if scaling else model.replicas,
                              "low": scaling.min if scaling else None, "high": scaling.max if scaling else None,
                              "adapters": [a.name for a in model.adapters]}
    for replica_id, replica in replicas.items():
        entry = models.setdefault(replica["model"], {"wanted": 0, "ready": 0, "replicas": {}, "in_catalog": False,
                                                     "adapters": []})
        entry["replicas"][replica_id] = replica
        entry["ready"] += replica["state"] == "ready"
    return dict(sorted(models.items()))


def serve_form(fit: Any) -> dict[str, Any]:
    """The model explorer's serve form filled in from `fit` (`llmgw.plan.ModelFit`): a model name from the source,
    the first engine of the first GPU class that fits (its tensor parallel as the GPUs), else of the first CPU node
    that fits (its cores, the memory the model needs), the weights line (source and sha256 when known; a directory
    source alone). Pure."""
    facts = fit.facts
    stem = facts.source.rstrip("/").rsplit("/", 1)[-1].split("@")[0]
    stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")[:60] or "model"
    gpu = next((c for c in fit.classes if c.fits), None)
    cpu = next((n for n in fit.cpu_nodes if n.fits), None)
    form: dict[str, Any] = {"model": name, "replicas": 1, "weights": facts.source + (
        f" {facts.sha256}" if facts.sha256 and not facts.source.endswith("/") else ""),
        "gpus": 0, "gpu_class": "", "tensor_parallel": "", "cpu_cores": "", "memory_bytes": ""}
    if gpu is not None:
        form.update(engine=gpu.engines[0], gpus=gpu.tensor_parallel, gpu_class=gpu.gpu_class,
                    tensor_parallel=gpu.tensor_parallel)
    else:
        engines = cpu.engines if cpu is not None else ("llama.cpp",) if facts.format == "gguf" else ("vllm",)
        form.update(engine=engines[0], cpu_cores=cpu.threads if cpu is not None else 1,
                    memory_bytes=fit.needed_bytes)
    return form

"""Replicas' GPU-hours and CPU core-hours per project, shared in proportion to use, and their price. Pure.

A replica holds its devices whether one request or ten run on it: at every moment, its GPUs (or, for a CPU replica,
its reserved cores) are divided evenly among the requests in flight on it then, so a request alone on a replica
takes all of them for its duration, and two at once half each. A request's share is read from its usage record
(it ran from `time - duration_seconds` to `time` on `replica`); a project's GPU-hours are the sum of its requests'
shares. Time when no request runs on a replica is idle: nobody's, and not counted. Slurm jobs' rows (model
"slurm/...") are priced when recorded (`llmgw.control.slurm_usage`) and left out here, as are rows no replica
answered.

Prices: llmgw.yaml `prices.gpu_hour_cost`, per GPU class (else its `default`) for one GPU for one hour, and under
`cpu` for one CPU core for one hour (the Slurm jobs' rule). GPU replicas reserve no cores (the planner does not
count them), so their core-hours are 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from llmgw.store.records import UsageRecord

CPU_CLASS = "cpu"
"""The `gpu_hour_cost` key pricing one CPU core for one hour (Slurm jobs without GPUs use it too)."""


@dataclass(frozen=True)
class ReplicaSize:
    """What one replica of a model holds: `gpus` of `gpu_class` ("" none), or `cpu_cores` when it has no GPUs."""

    gpus: int
    gpu_class: str = ""
    cpu_cores: float = 0.0


@dataclass(frozen=True)
class HoursRow:
    """One project's use of one model's replicas: GPU-hours, CPU core-hours, its requests, and their price (in
    the cluster's currency, from `gpu_hour_cost`)."""

    project: str
    model: str
    requests: int
    gpu_hours: float
    core_hours: float
    cost: float

    def to_json(self) -> dict[str, float | int | str]:
        return {"project": self.project, "model": self.model, "requests": self.requests,
                "gpu_hours": self.gpu_hours, "core_hours": self.core_hours, "cost": self.cost}


def shares_of_use(records: Iterable[UsageRecord]) -> list[tuple[UsageRecord, float]]:
    """Each record answered by a replica with its share of that replica, in seconds (what its time on the replica
    weighs once divided among the requests in flight with it: the shares of one replica's requests sum to the
    time any of them ran). Records without a replica, or of Slurm jobs, are left out."""
    by_replica: dict[tuple[str, str], list[UsageRecord]] = defaultdict(list)
    for record in records:
        if record.replica and not record.model.startswith("slurm/"):
            by_replica[(record.model, record.replica)].append(record)
    shares: list[tuple[UsageRecord, float]] = []
    for group in by_replica.values():
        # sweep the starts and ends: `level` is the integral of 1 / (requests in flight) over time so far, and a
        # request's share is the level at its end less the level at its start
        timed = [i for i, r in enumerate(group) if r.duration_seconds > 0]  # an instant holds nothing
        events = sorted([(group[i].time - group[i].duration_seconds, 1, i) for i in timed]
                        + [(group[i].time, 0, i) for i in timed])  # at one moment, ends before starts
        level, running, last = 0.0, 0, None
        started = [0.0] * len(group)
        ended = [0.0] * len(group)
        for moment, is_start, index in events:
            if last is not None and running:
                level += (moment - last) / running
            last = moment
            if is_start:
                started[index] = level
                running += 1
            else:
                ended[index] = level
                running -= 1
        shares.extend((record, ended[i] - started[i]) for i, record in enumerate(group))
    return shares


def hour_price(gpu_hour_cost: Mapping[str, float], gpu_class: str) -> float:
    """One hour of one GPU of `gpu_class` at `gpu_hour_cost`: its class's price, else `default`'s, else 0."""
    price = gpu_hour_cost.get(gpu_class) if gpu_class else None
    return price if price is not None else gpu_hour_cost.get("default", 0.0)


def gpu_hours(records: Iterable[UsageRecord], sizes: Mapping[str, ReplicaSize],
              gpu_hour_cost: Mapping[str, float]) -> list[HoursRow]:
    """GPU-hours and core-hours per (project, model) of `records`, by project then model, priced at
    `gpu_hour_cost`. `sizes` gives each model's replica size (a model it does not name, e.g. one gone from the
    catalog, counts its requests with 0 hours). Pass every record of the window, of every project: a project's
    share depends on the requests of the others that ran beside it."""
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for record, seconds in shares_of_use(records):
        size = sizes.get(record.model, ReplicaSize(0))
        row = totals[(record.project, record.model)]
        row[0] += 1
        if size.gpus:
            row[1] += size.gpus * seconds / 3600.0
        else:
            row[2] += size.cpu_cores * seconds / 3600.0
    rows = []
    for (project, model), (requests, gpu, cores) in sorted(totals.items()):
        size = sizes.get(model, ReplicaSize(0))
        cost = gpu * hour_price(gpu_hour_cost, size.gpu_class) + cores * gpu_hour_cost.get(CPU_CLASS, 0.0)
        rows.append(HoursRow(project, model, int(requests), gpu, cores, cost))
    return rows

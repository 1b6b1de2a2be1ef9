"""The GPU-hours and core-hours each project used of the replicas (`llmgw.store.gpu_hours`), as `llmgw usage
--gpu-hours` and GET /api/v1/usage/gpu-hours answer them: read from the store's usage records, each model's replica
size and the prices from the settings in force."""

from __future__ import annotations

import time
from typing import Any

from llmgw.settings.model import Settings
from llmgw.store import ReplicaSize, gpu_hours

MAX_RECORDS = 200_000
"""The most usage records one answer reads (the newest); an answer that reached it says so (`truncated`)."""


def replica_sizes(settings: Settings) -> dict[str, ReplicaSize]:
    """What one replica of each model of `settings` holds: its GPUs and their class, or its CPU cores."""
    sizes = {}
    for name, model in settings.models.items():
        gpus = model.resources.gpus
        sizes[name] = ReplicaSize(gpus, model.resources.gpu_class or "", 0.0 if gpus else model.resources.cpu_cores)
    return sizes


def hours_document(store: Any, settings: Settings, since: float | None, project: str | None = None) -> dict[str, Any]:
    """{"since": ISO 8601 UTC or null, "project", "currency", "rows": [HoursRow.to_json(), ...], "records",
    "truncated"} for the requests that ended since `since` (unix seconds; None: all), of `project` only when given
    (shares are computed over every project's requests). Blocking (reads the store)."""
    records = store.recent_usage(None, since, MAX_RECORDS)
    rows = gpu_hours(records, replica_sizes(settings), settings.cluster.gpu_hour_cost)
    if project is not None:
        rows = [row for row in rows if row.project == project]
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)) if since is not None else None
    return {"since": when, "project": project, "currency": settings.cluster.currency,
            "rows": [row.to_json() for row in rows], "records": len(records), "truncated": len(records) >= MAX_RECORDS}

"""Where a pass's plan differs from the plan a review showed, and why. Pure.

`llmgw apply --review REVIEW.json` hands the control plane the plan `llmgw review` computed (its `plan`, for the
head commit, against the fleet of then). Each pass that plans that commit compares the placements: the plan's
assignments are where each replica should run, whatever was already done, so a pass after the first compares as
well as the first. A replica the review placed elsewhere, on other devices, or not at all (or the other way round)
is a difference, with the reason read from the pass's fleet: the reviewed node is lost or gone, a reviewed GPU is
now held by another process or out of placement for its health, or else the fleet changed since the review (its
revision named).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmgw.plan.types import Assignment, Fleet, Plan


@dataclass(frozen=True)
class ReviewedPlan:
    """What was reviewed: the settings `commit` (40 hex), the review's fleet `revision` ("sha256:..."), the
    `plan` it showed, and its `forecast`: the review's `forecast.models` (one JSON object per changed model, as
    `llmgw.plan.forecast_check.check_forecast` reads them; empty: the review forecast nothing)."""

    commit: str
    fleet_revision: str
    plan: Plan
    forecast: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Difference:
    """Replica `replica_id`: where the review placed it (`reviewed`, e.g. "n1 GPU 0,1", "n1", or "unplaced") and
    where this pass places it (`now`), and `why`."""

    replica_id: str
    reviewed: str
    now: str
    why: str

    def __str__(self) -> str:
        return f"{self.replica_id}: {self.now}, reviewed {self.reviewed}: {self.why}"

    def to_json(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "reviewed": self.reviewed, "now": self.now, "why": self.why}


def _where(placed: list[Assignment]) -> str:
    if not placed:
        return "unplaced"
    parts = []
    for a in sorted(placed, key=lambda a: (a.rank, a.node_id)):
        parts.append(a.node_id + (f" GPU {','.join(a.devices)}" if a.devices else ""))
    return " + ".join(parts)


def _why(reviewed: list[Assignment], fleet: Fleet, revision: str) -> str:
    """Why the reviewed placement `reviewed` is not this pass's, from `fleet` (the pass's)."""
    reasons = []
    for assignment in reviewed:
        node = fleet.node(assignment.node_id)
        if node is None:
            reasons.append(f"node {assignment.node_id} is no longer registered")
            continue
        if not node.alive:
            reasons.append(f"node {assignment.node_id} was lost since the review")
            continue
        gpus = {g.device_id: g for g in node.gpus}
        for device in assignment.devices:
            gpu = gpus.get(device)
            if gpu is None:
                reasons.append(f"GPU {device} of {assignment.node_id} is no longer reported")
            elif gpu.foreign_processes:
                reasons.append(f"GPU {device} of {assignment.node_id} is now held by another process")
            elif gpu.unhealthy:
                reasons.append(f"GPU {device} of {assignment.node_id} is out of placement: {gpu.unhealthy}")
    return "; ".join(reasons) or f"the fleet changed since the review (it was planned against {revision[:19]})"


def review_differences(reviewed: ReviewedPlan, plan: Plan, fleet: Fleet) -> list[Difference]:
    """Every replica whose placement in `plan` (a pass's plan, made from `fleet`) is not the one `reviewed` showed,
    by replica id; empty when they agree. A replica neither placed nor wanted by either is not named."""
    before: dict[str, list[Assignment]] = {}
    after: dict[str, list[Assignment]] = {}
    for assignment in reviewed.plan.assignments:
        before.setdefault(assignment.replica_id, []).append(assignment)
    for assignment in plan.assignments:
        after.setdefault(assignment.replica_id, []).append(assignment)
    wanted = set(before) | set(after) | {u.replica_id for u in reviewed.plan.unplaced} | {
        u.replica_id for u in plan.unplaced}
    unplaced_now = {u.replica_id: u for u in plan.unplaced}
    differences = []
    for replica in sorted(wanted):
        old, new = _where(before.get(replica, [])), _where(after.get(replica, []))
        if old == new:
            continue
        if not before.get(replica) and replica not in {u.replica_id for u in reviewed.plan.unplaced}:
            why = "the review did not plan this replica"
        elif not before.get(replica):
            why = "the review could not place it; the fleet changed since"
        else:
            why = _why(before[replica], fleet, reviewed.fleet_revision)
        if new == "unplaced" and replica in unplaced_now and unplaced_now[replica].reasons:
            why += "; now: " + "; ".join(f"{node}: {reason}" for node, reason in unplaced_now[replica].reasons[:3])
        differences.append(Difference(replica, old, new, why))
    return differences

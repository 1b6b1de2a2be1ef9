"""A plan for people (`render_plan`) and for machines (`plan_to_json` / `plan_from_json`).

`llmgw diff --live` prints `render_plan`'s lines (or `plan_to_json` with --json); the audit stores the JSON.
"""

from __future__ import annotations

from typing import Any

from llmgw.identity import describe_engine
from llmgw.plan.types import Action, ActionKind, Assignment, Plan, Unplaced
from llmgw.units import format_size

JSON_VERSION = 1


def _where(assignment: Assignment | None, node_id: str) -> str:
    if assignment is None:
        return node_id
    parts = []
    if assignment.devices:
        parts.append("GPU " + ",".join(assignment.devices))
    elif assignment.cpu_cores or assignment.memory_bytes:
        parts.append(f"{assignment.cpu_cores:g} cores")
        if assignment.memory_bytes:
            parts.append(format_size(assignment.memory_bytes))
    return f"{node_id} ({', '.join(parts)})" if parts else node_id


def _because(reason: str) -> str:
    return f": {reason}" if reason else ""


def render_plan(plan: Plan, *, include_keep: bool = True) -> list[str]:
    """Return one line per step of `plan` for a person, then the unplaced replicas, then the notes.

    A START whose replica stops (or stopped, on a lost node) elsewhere is shown as one "move" line; the
    matching STOP is folded into it. Lines start with the verb: install, start, restart, move, stop, keep,
    cannot place, note. `include_keep` False leaves out the keep lines (only changes).
    """
    stops_by_replica: dict[str, list[Action]] = {}
    for action in plan.actions:
        if action.kind is ActionKind.STOP:
            stops_by_replica.setdefault(action.replica_id, []).append(action)
    folded: set[tuple[str, str]] = set()
    lines = []
    for action in plan.actions:
        kind = action.kind
        if kind is ActionKind.INSTALL:
            lines.append(f"install {describe_engine(action.engine)} on {action.node_id}{_because(action.reason)}")
        elif kind is ActionKind.START:
            elsewhere = [s for s in stops_by_replica.get(action.replica_id, ()) if s.node_id != action.node_id]
            source = action.previous_node or (elsewhere[0].node_id if elsewhere else "")
            for stop in elsewhere:
                if stop.node_id == source:
                    folded.add((stop.node_id, stop.shard_id))
            target = _where(action.assignment, action.node_id)
            if source and source != action.node_id:
                lines.append(f"move {action.replica_id} from {source} to {target} as {action.shard_id}"
                             f"{_because(action.reason)}")
            else:
                lines.append(f"start {action.shard_id} on {target}{_because(action.reason)}")
        elif kind is ActionKind.RESTART:
            lines.append(f"restart {action.shard_id} on {_where(action.assignment, action.node_id)}"
                         f"{_because(action.reason)}")
        elif kind is ActionKind.STOP:
            if (action.node_id, action.shard_id) not in folded:
                lines.append(f"stop {action.shard_id} on {action.node_id}{_because(action.reason)}")
        elif include_keep:
            lines.append(f"keep {action.shard_id} on {_where(action.assignment, action.node_id)}"
                         f"{_because(action.reason)}")
    for item in plan.unplaced:
        lines.append(f"cannot place {item}".replace(" cannot be placed:", ":", 1))
    lines.extend(f"note: {note}" for note in plan.notes)
    return lines


def _assignment_json(a: Assignment) -> dict[str, Any]:
    return {"replica_id": a.replica_id, "model": a.model, "node_id": a.node_id, "shard_id": a.shard_id,
            "devices": list(a.devices), "cpu_cores": a.cpu_cores, "memory_bytes": a.memory_bytes,
            "fingerprint": a.fingerprint}


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """Return `plan` as JSON-ready data (dicts, lists, str, int, float, bool, None); no secret is in a plan.

    Shape: {"version": 1, "settings_commit", "changes": bool, "actions": [{"kind", "node_id", "replica_id",
    "shard_id", "model", "engine", "fingerprint", "reason", "previous_node", "assignment": {...} | null}]
    ("engine": an INSTALL's engine key; "fingerprint": a CONFIGURE's agent-settings fingerprint), "assignments":
    [{"replica_id", "model", "node_id", "shard_id", "devices", "cpu_cores", "memory_bytes", "fingerprint"}],
    "unplaced": [{"replica_id", "model", "reasons": [{"node", "reason"}]}], "notes": [str]}.
    """
    return {
        "version": JSON_VERSION,
        "settings_commit": plan.settings_commit,
        "changes": plan.changes,
        "actions": [{
            "kind": a.kind.value, "node_id": a.node_id, "replica_id": a.replica_id, "shard_id": a.shard_id,
            "model": a.model, "engine": a.engine, "fingerprint": a.fingerprint, "reason": a.reason, "previous_node": a.previous_node,
            "assignment": _assignment_json(a.assignment) if a.assignment is not None else None,
        } for a in plan.actions],
        "assignments": [_assignment_json(a) for a in plan.assignments],
        "unplaced": [{"replica_id": u.replica_id, "model": u.model,
                      "reasons": [{"node": n, "reason": r} for n, r in u.reasons]} for u in plan.unplaced],
        "notes": list(plan.notes),
    }


def _assignment_from(data: dict[str, Any]) -> Assignment:
    return Assignment(data["replica_id"], data["model"], data["node_id"], tuple(data.get("devices", ())),
                      float(data.get("cpu_cores", 0.0)), int(data.get("memory_bytes", 0)),
                      data.get("fingerprint", ""), data.get("shard_id", ""))


def plan_from_json(data: dict[str, Any]) -> Plan:
    """The `Plan` that `plan_to_json` wrote. Raises KeyError or ValueError on data of another shape."""
    actions = tuple(Action(
        ActionKind(a["kind"]), a["node_id"], a.get("replica_id", ""), a.get("shard_id", ""), a.get("model", ""),
        a.get("engine", ""), _assignment_from(a["assignment"]) if a.get("assignment") else None,
        a.get("reason", ""), a.get("previous_node", ""),
    ) for a in data["actions"])
    return Plan(
        tuple(_assignment_from(a) for a in data["assignments"]), actions,
        tuple(Unplaced(u["replica_id"], u["model"], tuple((r["node"], r["reason"]) for r in u["reasons"]))
              for u in data["unplaced"]),
        data.get("settings_commit"), tuple(data.get("notes", ())),
    )

"""A pass's planning, recorded: the exact fleet the planner was given and a digest of the plan it made, so that
the plan can be computed again, byte for byte, from an audit commit (`llmgw plan --at`).

The control plane writes two files into each audit commit (`llmgw.control.audit`), under `plan/`::

    plan/fleet.json   {"version": 1, "nodes": [NodeState, ...]}      the planner's input fleet, canonical JSON
    plan/pass.json    {"version": 1, "pass": int, "settings_commit": "40-hex" | null, "allow_empty": bool,
                       "fleet": "sha256:<hex of fleet.json's bytes>", "plan": "sha256:<hex>",
                       "canaries": {model: CanaryHold.to_json()},     (only while canaries ran: llmgw.plan.canary)
                       "replicas": {model: int}}                      (autoscaled models: llmgw.plan.autoscaling)

`fleet.json` is what the planner read and nothing else (`llmgw.control.deciding.planner_fleet`: the agents'
reports with the settings' view laid over them, lost nodes without shards, the STARTs in flight as pending
shards); none of the status document's health details, Slurm reports, pids or errors the planner does not read.
Every field of `NodeState` and what it holds is written except those equal to their default, in a canonical form
(keys sorted, no spaces), so an unchanged fleet gives the same bytes: git stores a blob by its content, so
successive audit commits of an unchanged fleet share one blob. `plan` is `plan_digest` of the plan the pass made
(every field of every action, assignment, unplaced replica and note).

Pure: data in, data out. Raises: UsageError for a file that is not such a record, naming `source`.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from llmgw.errors import UsageError
from llmgw.plan.canary import CanaryHold
from llmgw.plan.guard import EmptiedCatalogError
from llmgw.plan.planning import make_plan
from llmgw.plan.types import Fleet, NodeState, Plan
from llmgw.settings.model import Settings

RECORD_VERSION = 1
FLEET_FILE = "plan/fleet.json"
PASS_FILE = "plan/pass.json"


@dataclass(frozen=True)
class PlannedPass:
    """What `plan/pass.json` says: the pass `number`, the settings commit it planned (None: none), whether an
    empty catalog was allowed (`llmgw apply --allow-empty`), and the digests of its fleet file and of its plan."""

    number: int
    settings_commit: str | None
    allow_empty: bool
    fleet_digest: str
    plan_digest: str
    canaries: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """The canaries the planner was told of, as recorded (`CanaryHold.to_json`); `canary_holds` makes them again."""
    replicas: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """The autoscaler's wanted counts the planner was told (`make_plan(replicas=...)`)."""


def canary_holds(recorded: Mapping[str, Mapping[str, Any]], previous: Any) -> dict[str, CanaryHold]:
    """The `CanaryHold`s of a `PlannedPass.canaries`; `previous(commit, model)` gives the model's definition in a
    settings commit (a failed canary's old revision). Raises UsageError for a record of another shape."""
    try:
        return {name: CanaryHold(str(h["replica"]), str(h["commit"]), failed=bool(h["failed"]), reason=str(h["reason"]),
                                 previous_commit=h["previous_commit"],
                                 previous=previous(h["previous_commit"], name) if h["failed"] else None)
                for name, h in recorded.items()}
    except (KeyError, TypeError) as exc:
        raise UsageError(f"{PASS_FILE} records canaries of another shape: {exc!r}") from None


def plan_or_refusal(settings: Settings, fleet: Fleet, allow_empty: bool,
                    canaries: Mapping[str, CanaryHold] = types.MappingProxyType({}),
                    replicas: Mapping[str, int] = types.MappingProxyType({})) -> tuple[Plan, bool]:
    """(`make_plan(settings, fleet, allow_empty=..., canaries=..., replicas=...)`, False), or when the empty-catalog
    guard refuses,
    (a plan holding only the guard's sentence as a note, True): what a control-plane pass plans, and `llmgw plan
    --at`."""
    try:
        return make_plan(settings, fleet, allow_empty=allow_empty, canaries=canaries, replicas=replicas), False
    except EmptiedCatalogError as exc:
        return Plan(settings_commit=settings.commit, notes=(str(exc),)), True


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _encode(value: Any) -> Any:
    """A frozen dataclass as {field: value} without the fields equal to their default (a field typed float
    always as a float: 4 and 4.0 are equal, and must be equal bytes); tuples as lists, frozensets as sorted lists,
    enums as their value."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        hints = _hints(type(value))
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.default is not dataclasses.MISSING and item == f.default:
                continue
            if f.default_factory is not dataclasses.MISSING and item == f.default_factory():
                continue
            if hints[f.name] is float and isinstance(item, int) and not isinstance(item, bool):
                item = float(item)
            out[f.name] = _encode(item)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, frozenset):
        return sorted(_encode(v) for v in value)
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    return value


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode(kind: Any, data: Any) -> Any:
    """`data` (as `_encode` wrote it) as a value of type `kind`. Raises KeyError, TypeError or ValueError."""
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        return _decode(next(a for a in args if a is not type(None)), data)
    if origin is tuple:
        if not isinstance(data, list):
            raise TypeError(f"expected a list, got {json.dumps(data)[:40]}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in data)
        if len(args) != len(data):
            raise ValueError(f"expected {len(args)} items, got {len(data)}")
        return tuple(_decode(a, v) for a, v in zip(args, data, strict=True))
    if origin is frozenset:
        if not isinstance(data, list):
            raise TypeError(f"expected a list, got {json.dumps(data)[:40]}")
        return frozenset(_decode(args[0], v) for v in data)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        if not isinstance(data, dict):
            raise TypeError(f"expected an object, got {json.dumps(data)[:40]}")
        hints = _hints(kind)
        unknown = set(data) - set(hints)
        if unknown:
            raise ValueError(f"unknown key {sorted(unknown)[0]!r} of {kind.__name__}")
        return kind(**{name: _decode(hints[name], value) for name, value in data.items()})
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(data)
    if kind is float and isinstance(data, (int, float)) and not isinstance(data, bool):
        return float(data)
    if kind in (str, int, bool) and type(data) is kind:
        return data
    raise TypeError(f"expected {getattr(kind, '__name__', kind)}, got {json.dumps(data)[:40]}")


def fleet_record(fleet: Fleet, known: dict[NodeState, bytes] | None = None) -> bytes:
    """`plan/fleet.json` of `fleet` (canonical: equal fleets, equal bytes).

    `known`: each node's canonical JSON from an earlier call, by node (equal nodes, equal JSON); reused for the
    nodes it holds and replaced by this fleet's (a pass of a 250-node fleet changes a few nodes: encoding all of
    them costs about 0.1 s of CPU at 250 nodes of 8 GPUs, 7 ms when one changed)."""
    parts = []
    fresh: dict[NodeState, bytes] = {}
    for node in fleet.nodes:
        data = known.get(node) if known is not None else None
        if data is None:
            data = _canonical(_encode(node))
        fresh[node] = data
        parts.append(data)
    if known is not None:
        known.clear()
        known.update(fresh)
    return b'{"nodes":[' + b",".join(parts) + b'],"version":' + str(RECORD_VERSION).encode() + b"}"


def fleet_from_record(data: bytes, source: str = "plan/fleet.json") -> Fleet:
    """The `Fleet` `fleet_record` wrote, nodes in the same order (the planner's input, exactly).

    Raises: UsageError naming `source` and the node when the bytes are not such a record.
    """
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("version") != RECORD_VERSION:
            raise ValueError(f"version {doc.get('version') if isinstance(doc, dict) else None} is not "
                             f"{RECORD_VERSION}")
        nodes = []
        for index, node in enumerate(doc["nodes"]):
            try:
                nodes.append(_decode(NodeState, node))
            except (KeyError, TypeError, ValueError, StopIteration) as exc:
                raise ValueError(f"nodes[{index}]: {exc}") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{source} is not a recorded fleet: {exc}") from None
    return Fleet(tuple(nodes))


def plan_digest(plan: Plan) -> str:
    """"sha256:<hex>" of the canonical JSON of every field of `plan`: two plans have equal digests exactly when
    they are equal (same actions, assignments, unplaced replicas, notes, in the same order)."""
    return _digest(_canonical(_encode(plan)))


def recorded_files(number: int, settings: Settings, allow_empty: bool, fleet: Fleet, plan: Plan,
                   fleet_bytes: bytes | None = None,
                   canaries: Mapping[str, CanaryHold] = types.MappingProxyType({}),
                   replicas: Mapping[str, int] = types.MappingProxyType({})) -> dict[str, bytes]:
    """The files an audit commit carries for pass `number`, which planned `plan` from `settings` and `fleet` (and
    `canaries`, `replicas`): {FLEET_FILE: ..., PASS_FILE: ...}. `fleet_bytes`: `fleet_record(fleet)` when the caller has it
    already."""
    fleet_bytes = fleet_record(fleet) if fleet_bytes is None else fleet_bytes
    record = {"version": RECORD_VERSION, "pass": number, "settings_commit": settings.commit,
              "allow_empty": allow_empty, "fleet": _digest(fleet_bytes), "plan": plan_digest(plan)}
    if canaries:
        record["canaries"] = {name: hold.to_json() for name, hold in sorted(canaries.items())}
    if replicas:
        record["replicas"] = dict(sorted(replicas.items()))
    return {FLEET_FILE: fleet_bytes, PASS_FILE: json.dumps(record, indent=1, sort_keys=True).encode() + b"\n"}


def pass_from_record(data: bytes, fleet_bytes: bytes, source: str = "plan/pass.json") -> PlannedPass:
    """The `PlannedPass` of `plan/pass.json`, checked against the bytes of its `plan/fleet.json`.

    Raises: UsageError naming `source` when it is not such a record or the fleet file is not the one it names.
    """
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("version") != RECORD_VERSION:
            raise ValueError(f"version {doc.get('version') if isinstance(doc, dict) else None} is not "
                             f"{RECORD_VERSION}")
        canaries = doc.get("canaries", {})
        if not isinstance(canaries, dict):
            raise ValueError("canaries is not an object")
        replicas = doc.get("replicas", {})
        if not isinstance(replicas, dict):
            raise ValueError("replicas is not an object")
        planned = PlannedPass(int(doc["pass"]), doc["settings_commit"], bool(doc["allow_empty"]), str(doc["fleet"]),
                              str(doc["plan"]), canaries, {str(k): int(v) for k, v in replicas.items()})
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{source} is not a recorded pass: {exc}") from None
    if planned.fleet_digest != _digest(fleet_bytes):
        raise UsageError(f"{source} names fleet {planned.fleet_digest[:19]}, but {FLEET_FILE} beside it is "
                         f"{_digest(fleet_bytes)[:19]}: the record was changed by hand")
    return planned

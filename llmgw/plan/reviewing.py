"""The review of a settings change (`llmgw review BASE HEAD`): one value holding everything a reviewer reads. Pure.

`build_review` takes the two settings versions and a fleet snapshot and returns a `Review`: the semantic
settings diff, HEAD's plan against the fleet (per node: replicas started, stopped, moved), what cannot be
placed (with every node's reason, and whether BASE could place it), headroom before and after, quota and price
changes per project, and warnings. `review_to_json` is its machine form; `llmgw.cli.review_markdown` its
Markdown. `staleness` compares a stored review with one computed now.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from llmgw.plan.cpu_speed import ExpectedSpeed, expected_cpu_speeds
from llmgw.plan.forecasting import ModelForecast, RecordedLoad, forecast_change, forecast_to_json
from llmgw.plan.headroom import Headroom, headroom
from llmgw.plan.planning import make_plan
from llmgw.plan.project_changes import ProjectChange, ValueChange, gpu_hour_cost_changes, project_changes
from llmgw.plan.rendering import render_plan
from llmgw.plan.snapshot import FleetSnapshot
from llmgw.plan.types import ActionKind, Fleet, Plan, Unplaced
from llmgw.settings import is_not_acted_on
from llmgw.settings.diffing import SettingsDiff, diff_settings
from llmgw.settings.model import Settings
from llmgw.units import format_size

REVIEW_VERSION = 1
EXIT_NO_CHANGE, EXIT_ERROR, EXIT_FITS, EXIT_UNPLACED = 0, 1, 2, 3
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")  # as llmgw.settings.building refuses them


@dataclass(frozen=True)
class Step:
    """One change on one node: `verb` "start", "stop", "move in", "move out", "restart" or "install".

    `subject` is the shard id (engine key for "install"); `other_node` the node a move comes from or goes to;
    `where` the devices or cores it gets ("GPU 0,1", "0.75 cores, 1Gi"); `reason` the planner's words.
    """

    verb: str
    subject: str
    replica_id: str = ""
    model: str = ""
    other_node: str = ""
    where: str = ""
    reason: str = ""


@dataclass(frozen=True)
class NodeSteps:
    """The steps of the plan on one node, in plan order; `kept` counts shards that stay as they are."""

    node_id: str
    steps: tuple[Step, ...]
    kept: int = 0


@dataclass(frozen=True)
class UnplacedReplica:
    """A replica HEAD wants that no node can take, with each node's reason; `new` False when BASE could not
    place it either (the fleet was already short before this change)."""

    replica_id: str
    model: str
    reasons: tuple[tuple[str, str], ...]
    new: bool = True


@dataclass(frozen=True)
class ReviewWarning:
    """A warning about HEAD's settings ("catalog/x.yaml:7:5: weights[0].source: warning: pinned by sha256 alone");
    `kind` "settings" (the settings loader's own warnings), "pickle", "not-acted-on" or "refused";
    `new` False when BASE has the same warning."""

    kind: str
    text: str
    new: bool = True


@dataclass(frozen=True)
class Review:
    """Everything `llmgw review` shows. Commits are full ids; `fleet_source` says where the fleet came from.

    `base_drift` holds the lines of BASE's own plan against the fleet when the fleet has not converged to BASE
    (changes that would happen without this change); empty when it has. `expected_speeds` the decode speed
    expected of each replica HEAD places on a CPU node whose bandwidth was probed (`llmgw.plan.cpu_speed`).
    `forecasts`: each changed model's forecast (`llmgw.plan.forecasting`) from the snapshot's load over
    `load_window_seconds` up to `load_until` (0 and "": the snapshot recorded no load, and only GPU-hours are
    forecast); `currency` HEAD's, of its costs.
    """

    base_ref: str
    head_ref: str
    base_commit: str | None
    head_commit: str | None
    fleet_source: str
    fleet_taken_at: str
    fleet_revision: str
    fleet_settings_commit: str | None
    settings_diff: SettingsDiff
    plan: Plan
    nodes: tuple[NodeSteps, ...]
    unplaced: tuple[UnplacedReplica, ...]
    headroom: Headroom
    projects: tuple[ProjectChange, ...]
    gpu_hour_cost: tuple[ValueChange, ...]
    warnings: tuple[ReviewWarning, ...]
    base_drift: tuple[str, ...] = ()
    expected_speeds: tuple[ExpectedSpeed, ...] = ()
    forecasts: tuple[ModelForecast, ...] = ()
    load_window_seconds: float = 0.0
    load_until: str = ""
    currency: str = "USD"

    @property
    def changes(self) -> bool:
        """True when the settings differ or the plan does something."""
        return bool(self.settings_diff) or self.plan.changes

    @property
    def fits(self) -> bool:
        """True when every replica HEAD wants can be placed (the planner's `unplaced` is empty)."""
        return not self.plan.unplaced

    @property
    def exit_code(self) -> int:
        """3 something cannot be placed; 2 a change that fits; 0 no change."""
        if not self.fits:
            return EXIT_UNPLACED
        return EXIT_FITS if self.changes else EXIT_NO_CHANGE

    @property
    def verdict(self) -> str:
        """"does not fit", "fits" or "no change" (what `exit_code` says, in words)."""
        return {EXIT_UNPLACED: "does not fit", EXIT_FITS: "fits", EXIT_NO_CHANGE: "no change"}[self.exit_code]


def _where(assignment) -> str:
    if assignment is None:
        return ""
    if assignment.devices:
        return "GPU " + ",".join(assignment.devices)
    parts = [f"{assignment.cpu_cores:g} cores"]
    if assignment.memory_bytes:
        parts.append(format_size(assignment.memory_bytes))
    return ", ".join(parts)


def node_steps(plan: Plan) -> tuple[NodeSteps, ...]:
    """The plan's actions grouped by node (by node id); a START whose replica stops on another node, or that
    replaces a shard on a lost node, is a "move in" here and a "move out" there (its STOP folded in)."""
    stops: dict[str, list] = {}
    for action in plan.actions:
        if action.kind is ActionKind.STOP:
            stops.setdefault(action.replica_id, []).append(action)
    per_node: dict[str, list[Step]] = {}
    kept: dict[str, int] = {}
    folded: set[tuple[str, str]] = set()
    for action in plan.actions:
        if action.kind is not ActionKind.START:
            continue
        elsewhere = [s for s in stops.get(action.replica_id, ()) if s.node_id != action.node_id]
        source = action.previous_node or (elsewhere[0].node_id if elsewhere else "")
        if source and source != action.node_id:
            stopped = [s for s in elsewhere if s.node_id == source]
            folded.update((s.node_id, s.shard_id) for s in stopped)
            per_node.setdefault(source, []).append(Step(
                "move out", stopped[0].shard_id if stopped else action.replica_id, action.replica_id, action.model,
                action.node_id, reason=stopped[0].reason if stopped else action.reason))
    for action in plan.actions:
        node = per_node.setdefault(action.node_id, [])
        kind = action.kind
        if kind is ActionKind.KEEP:
            kept[action.node_id] = kept.get(action.node_id, 0) + 1
        elif kind is ActionKind.INSTALL:
            node.append(Step("install", action.engine, reason=action.reason))
        elif kind is ActionKind.STOP:
            if (action.node_id, action.shard_id) not in folded:
                node.append(Step("stop", action.shard_id, action.replica_id, action.model, reason=action.reason))
        elif kind is ActionKind.RESTART:
            node.append(Step("restart", action.shard_id, action.replica_id, action.model,
                             where=_where(action.assignment), reason=action.reason))
        else:
            elsewhere = [s for s in stops.get(action.replica_id, ()) if s.node_id != action.node_id]
            source = action.previous_node or (elsewhere[0].node_id if elsewhere else "")
            verb = "move in" if source and source != action.node_id else "start"
            node.append(Step(verb, action.shard_id, action.replica_id, action.model,
                             source if verb == "move in" else "", _where(action.assignment), action.reason))
    return tuple(NodeSteps(n, tuple(per_node[n]), kept.get(n, 0)) for n in sorted(per_node)
                 if per_node[n] or kept.get(n))


def review_warnings(base: Settings, head: Settings, refused: str | None = None) -> tuple[ReviewWarning, ...]:
    """HEAD's warnings: the settings loader's (`Settings.warnings`: weights pinned by sha256 alone, and whatever
    else llmgw.settings warns about), models allowed to load pickles, and files accepted but not acted on yet
    (`enabled: true` in slurm.yaml, as this check has it). `refused`: why the
    control plane would refuse HEAD (the empty-catalog guard), shown first. `new` False when BASE warns the same."""

    def own(settings: Settings) -> list[ReviewWarning]:
        found = [ReviewWarning("not-acted-on" if is_not_acted_on(w) else "settings", str(w)) for w in settings.warnings]
        for model in sorted(settings.models.values(), key=lambda m: m.name):
            if model.allow_pickle:
                pickles = [w.filename for w in model.weights if w.source.endswith(_PICKLE_SUFFIXES)]
                what = f" ({', '.join(pickles)})" if pickles else ""
                found.append(ReviewWarning("pickle", f"{model.source_file or model.name}: allow_pickle: true: "
                                                     f"weights in a pickle format{what} can run code when loaded"))
        warned = {getattr(w, "file", "") for w in settings.warnings}
        switches = {"slurm": settings.slurm.enabled}
        for name, enabled in switches.items():
            # Left to the loader once it warns about the file itself (its list of keys not acted on yet).
            if enabled and f"{name}.yaml" not in warned:
                found.append(ReviewWarning("not-acted-on", f"{name}.yaml: enabled: true is accepted but not "
                                                           f"acted on yet: no part of llmgw applies {name}.yaml"))
        return found

    before = {w.text for w in own(base)}
    result = [ReviewWarning("refused", refused)] if refused else []
    return tuple(result + [ReviewWarning(w.kind, w.text, w.text not in before) for w in own(head)])


def build_review(
    base: Settings, head: Settings, snapshot: FleetSnapshot, *, base_ref: str, head_ref: str,
    fleet_source: str, view: Callable[[Fleet, Settings], Fleet] = lambda fleet, settings: fleet,
) -> Review:
    """The review of the change from `base` to `head` against `snapshot`'s fleet.

    `view(fleet, settings)` lays a settings version's agent settings over the reported fleet (the control
    plane's `fleet_for`); the identity by default. HEAD is planned as the control plane would plan it, except
    that an emptied catalog is planned anyway and reported as a "refused" warning instead of raising.
    """
    from llmgw.plan.guard import EmptiedCatalogError, guard_fleet_not_emptied

    head_fleet, base_fleet = view(snapshot.fleet, head), view(snapshot.fleet, base)
    refused = None
    try:
        guard_fleet_not_emptied(head, head_fleet)
    except EmptiedCatalogError as exc:
        refused = f"the control plane would refuse HEAD: {exc}"
    plan = make_plan(head, head_fleet, allow_empty=True)
    base_plan = make_plan(base, base_fleet, allow_empty=True)
    base_unplaced = {u.replica_id for u in base_plan.unplaced}
    unplaced = tuple(UnplacedReplica(u.replica_id, u.model, u.reasons, u.replica_id not in base_unplaced)
                     for u in plan.unplaced)
    drift = tuple(render_plan(base_plan, include_keep=False)) if base_plan.changes else ()
    load = snapshot.load or RecordedLoad(window_seconds=0.0)
    return Review(
        base_ref=base_ref, head_ref=head_ref, base_commit=base.commit, head_commit=head.commit,
        fleet_source=fleet_source, fleet_taken_at=snapshot.taken_at, fleet_revision=snapshot.revision,
        fleet_settings_commit=snapshot.settings_commit, settings_diff=diff_settings(base, head), plan=plan,
        nodes=node_steps(plan), unplaced=unplaced, headroom=headroom(head_fleet, plan),
        projects=project_changes(base, head), gpu_hour_cost=gpu_hour_cost_changes(base, head),
        warnings=review_warnings(base, head, refused), base_drift=drift,
        expected_speeds=expected_cpu_speeds(head, head_fleet, plan),
        forecasts=forecast_change(base, head, head_fleet, plan, load), load_window_seconds=load.window_seconds,
        load_until=load.until, currency=head.cluster.currency,
    )


def _values(changes: tuple[ValueChange, ...]) -> list[dict[str, str]]:
    return [{"subject": c.subject, "key": c.key, "old": c.old, "new": c.new} for c in changes]


def review_to_json(review: Review) -> dict[str, Any]:
    """The review as JSON-ready data; its shape is documented in docs/review.md ("The JSON document")."""
    from llmgw.plan.rendering import plan_to_json

    room = review.headroom
    return {
        "version": REVIEW_VERSION,
        "verdict": review.verdict, "exit_code": review.exit_code, "changes": review.changes, "fits": review.fits,
        "base": {"ref": review.base_ref, "commit": review.base_commit},
        "head": {"ref": review.head_ref, "commit": review.head_commit},
        "fleet": {"source": review.fleet_source, "taken_at": review.fleet_taken_at,
                  "revision": review.fleet_revision, "settings_commit": review.fleet_settings_commit},
        "settings_diff": review.settings_diff.to_json(),
        "nodes": [{"node_id": n.node_id, "kept": n.kept, "steps": [
            {"verb": s.verb, "subject": s.subject, "replica_id": s.replica_id, "model": s.model,
             "other_node": s.other_node, "where": s.where, "reason": s.reason} for s in n.steps]}
            for n in review.nodes],
        "unplaced": [{"replica_id": u.replica_id, "model": u.model, "new": u.new,
                      "reasons": [{"node": n, "reason": r} for n, r in u.reasons]} for u in review.unplaced],
        "headroom": {
            "gpus": [{"gpu_class": g.gpu_class, "devices": g.devices, "free_before": g.free_before,
                      "free_after": g.free_after, "largest_before": g.largest_before,
                      "largest_after": g.largest_after} for g in room.gpus],
            "cpu": {"cores": room.cpu.cores, "cores_free_before": room.cpu.cores_free_before,
                    "cores_free_after": room.cpu.cores_free_after, "memory_bytes": room.cpu.memory_bytes,
                    "memory_free_before": room.cpu.memory_free_before,
                    "memory_free_after": room.cpu.memory_free_after},
        },
        "projects": [{"project": p.project, "action": p.action, "quotas": _values(p.quotas),
                      "models_added": list(p.models_added), "models_removed": list(p.models_removed),
                      "prices": _values(p.prices)} for p in review.projects],
        "gpu_hour_cost": _values(review.gpu_hour_cost),
        "warnings": [{"kind": w.kind, "text": w.text, "new": w.new} for w in review.warnings],
        "base_drift": list(review.base_drift),
        "expected_speeds": [speed.to_json() for speed in review.expected_speeds],
        "forecast": {"window_seconds": review.load_window_seconds, "until": review.load_until,
                     "currency": review.currency,
                     "models": [forecast_to_json(f) for f in review.forecasts]},
        "plan": plan_to_json(review.plan),
    }


def _plan_lines(data: Mapping[str, Any]) -> list[str]:
    from llmgw.plan.rendering import plan_from_json

    return render_plan(plan_from_json(data), include_keep=False)


def staleness(recorded: Mapping[str, Any], current: Review) -> list[str]:
    """Why the review `recorded` (a `review_to_json` document) no longer holds, compared with `current` (the
    same BASE and HEAD reviewed now); empty when it still holds.

    It is stale when BASE or HEAD names another commit now, or when the plan differs (the fleet changed in a
    way that matters). A fleet that changed without changing the plan (free memory moved, a heartbeat) keeps it.
    Raises: KeyError or ValueError when `recorded` is not a review document.
    """
    reasons = []
    for side, commit, ref in (("base", current.base_commit, current.base_ref),
                              ("head", current.head_commit, current.head_ref)):
        old = recorded[side]["commit"]
        if old != commit:
            reasons.append(f"{side} {ref} was {(old or 'a directory')[:12]} and is {(commit or 'a directory')[:12]} "
                           f"now")
    old_lines, new_lines = _plan_lines(recorded["plan"]), render_plan(current.plan, include_keep=False)
    if old_lines != new_lines:
        gone = [f"no longer: {line}" for line in old_lines if line not in new_lines]
        added = [f"now: {line}" for line in new_lines if line not in old_lines]
        fleet = recorded["fleet"]
        reasons.append(f"the plan changed (fleet {fleet['revision'][:19]} taken {fleet['taken_at'] or '?'} is "
                       f"{current.fleet_revision[:19]} taken {current.fleet_taken_at or '?'} now): "
                       + "; ".join(gone + added))
    return reasons

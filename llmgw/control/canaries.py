"""Canary rollouts in the control plane: when one starts, when it is measured, what its verdict does. Pure.

A canary is runtime state (`ControlState.canaries`, one `Canary` per model), never a settings edit: the settings
hold the policy (`rollout:` in the catalog), the control plane the current phase and the reason, recorded in every
audit commit (status.yaml `canaries:`, and a line per canary in the commit message).

- `canaries_for_settings`: new settings in force start a canary for each model whose `rollout.strategy` is
  `canary`, that the settings before had with replicas, and whose fingerprint changed (a change that restarts its
  replicas); the canary replica is the model's first. Settings that bring the model back to what its old
  replicas run (a revert) end the canary; a change of anything else (a price) keeps it; a further change of the
  revision starts another against the same old replicas (against the held revision, once a canary held).
- `watch_canaries` (each pass, leader): a running canary is ready once a shard of its replica runs the new
  fingerprint READY on a live node; `window` seconds later (a timer wakes that pass) it is measured
  (`MeasureCanary`: the handler reads its usage records and answers with `canary_measured`).
- `canary_measured`: `llmgw.plan.canary.judge_canary` decides. WAIT: measured again a tenth of the window later
  (at least 1 s). HOLDS: phase held, the planner rolls the rest (`reconcile.max_surge`). MISSES: phase failed;
  the planner plans the model as its old replicas run it (the canary shard stops, the old replicas stay), the
  applied ref does not move to that commit, and `ProposeRevert` pushes a revert of the commit to the branch
  `llmgw/revert-<12 hex>` (never to the settings branch); `revert_proposed` records the branch or the error.
- `holds_of` (for the planner) and `route_canaries` (for the routing table: the canary's share while it runs, 0
  once it failed and until its shard is gone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from llmgw.control.effects import Effect, MeasureCanary, ProposeRevert
from llmgw.control.state import Canary, CanaryPhase, ControlState, frozen
from llmgw.identity import ShardState
from llmgw.plan.canary import CanaryHold, CanarySample, Verdict, judge_canary
from llmgw.plan.identity import engine_version_of, fingerprint, replica_ids
from llmgw.settings.model import Model, Settings

MIN_RECHECK = 1.0
"""Seconds, at least, between two measurements of one canary that waits for more requests."""


def revert_branch(commit: str) -> str:
    """The branch a failed canary's revert of settings commit `commit` is pushed to."""
    return f"llmgw/revert-{commit[:12]}"


def _fingerprint(settings: Settings, model: Model) -> str:
    return fingerprint(model, engine_version_of(settings, model))


def canaries_for_settings(canaries: Mapping[str, Canary], before: Settings | None,
                          after: Settings | None) -> Mapping[str, Canary]:
    """The canaries once `after` is in force instead of `before` (see the module); `canaries` itself when nothing
    changes. Settings without a commit (a directory) start none."""
    if after is None or after is before:
        return canaries
    result = dict(canaries)
    for name in set(canaries) | set(after.models):
        model = after.models.get(name)
        current = canaries.get(name)
        if model is None or model.endpoints or not model.rollout.canary or not replica_ids(model):
            result.pop(name, None)  # gone, external, or no longer a canary: the operator's settings decide
            continue
        new = _fingerprint(after, model)
        if current is not None and current.phase is CanaryPhase.HELD and new != current.fingerprint:
            current = None  # it held and rolled out: the next change is compared with what it rolled out
        if current is not None:
            if new == current.fingerprint:
                if current.rollout != model.rollout:
                    result[name] = replace(current, rollout=model.rollout)
                continue
            old_model, old_fp, old_commit = current.previous, _fingerprint(after, current.previous), current.previous_commit
        else:
            old_model = before.models.get(name) if before is not None else None
            if old_model is None or old_model.endpoints or not replica_ids(old_model):
                continue
            old_fp, old_commit = _fingerprint(before, old_model), before.commit
        if new == old_fp or not after.commit:
            result.pop(name, None)  # back to what the old replicas run (a revert): nothing to try
            continue
        result[name] = Canary(model=name, commit=after.commit, previous_commit=old_commit, previous=old_model,
                              fingerprint=new, replica_id=replica_ids(model)[0], rollout=model.rollout)
    return result if result != dict(canaries) else canaries


def holds_of(canaries: Mapping[str, Canary]) -> Mapping[str, CanaryHold]:
    """What the planner is told (`make_plan(canaries=...)`): a hold per running or failed canary."""
    return frozen({name: CanaryHold(c.replica_id, c.commit, failed=c.phase is CanaryPhase.FAILED,
                                    previous=c.previous if c.phase is CanaryPhase.FAILED else None,
                                    reason=c.reason if c.phase is CanaryPhase.FAILED else "",
                                    previous_commit=c.previous_commit)
                   for name, c in canaries.items() if c.phase is not CanaryPhase.HELD})


def route_canaries(canaries: Mapping[str, Canary]) -> Mapping[str, tuple[str, float]]:
    """model -> (the canary revision's fingerprint, its share of requests) for `build_route_table`: the rollout's
    share while running, 0 once failed; held canaries route as any replica."""
    return {name: (c.fingerprint, c.rollout.share if c.phase is CanaryPhase.RUNNING else 0.0)
            for name, c in canaries.items() if c.phase is not CanaryPhase.HELD}


def _canary_ready(state: ControlState, canary: Canary) -> bool:
    for record in state.fleet.records():
        if record.lost:
            continue
        for shard in record.state.shards:
            if (shard.replica_id == canary.replica_id and shard.fingerprint == canary.fingerprint
                    and shard.state is ShardState.READY and not shard.adopted_foreign):
                return True
    return False


def watch_canaries(state: ControlState, now: float, now_unix: float) -> tuple[ControlState, list[Effect]]:
    """(Leader, each pass at `now`, control-plane clock; `now_unix` for the records.) Running canaries that became
    ready get their `ready_at` and a timer at the window's end; those due are measured (`MeasureCanary`).
    Returns the next state (`state` itself when nothing changed) and the effects."""
    if not state.canaries:
        return state, []
    canaries = dict(state.canaries)
    timers = list(state.timers)
    effects: list[Effect] = []
    for name, canary in state.canaries.items():
        if canary.phase is not CanaryPhase.RUNNING or canary.measuring:
            continue
        if canary.ready_at is None:
            if not _canary_ready(state, canary):
                continue
            due = now + canary.rollout.window
            canary = replace(canary, ready_at=now, ready_at_unix=now_unix, check_at=due)
            timers.append((due, f"canary of {name} due"))
        if canary.check_at is not None and now >= canary.check_at:
            canary = replace(canary, measuring=True)
            effects.append(MeasureCanary(name, canary.commit, f"{canary.replica_id}@canary", canary.ready_at_unix,
                                         elapsed=now - (canary.ready_at or now)))
        canaries[name] = canary
    if canaries == dict(state.canaries):
        return state, effects
    return replace(state, canaries=frozen(canaries), timers=tuple(timers)), effects


def canary_measured(model: str, commit: str, samples: Sequence[CanarySample], elapsed: float):
    """The transition of `MeasureCanary`'s answer: the `samples` of `model`'s canary of `commit`, `elapsed` seconds
    after it was ready. Judged (`judge_canary`); a canary that changed meanwhile (another commit) is left alone.
    Placement-relevant when the phase changed (the planner and the routing table read it)."""

    def transition(state: ControlState) -> tuple[ControlState, bool, tuple[Effect, ...]]:
        canary = state.canaries.get(model)
        if canary is None or canary.commit != commit or canary.phase is not CanaryPhase.RUNNING:
            return state, False, ()
        verdict = judge_canary(canary.rollout, samples, elapsed)
        figures = {"reason": verdict.reason, "requests": verdict.requests, "error_rate": verdict.error_rate,
                   "ttft_p90": verdict.ttft_p90, "measuring": False}
        effects: tuple[Effect, ...] = ()
        if verdict.verdict is Verdict.WAIT:
            step = max(MIN_RECHECK, canary.rollout.window / 10)
            due = (canary.check_at or 0.0) + step
            changed = replace(canary, check_at=due, **figures)
            timers = (*state.timers, (due, f"canary of {model} measured again"))
            return replace(state, canaries=frozen({**state.canaries, model: changed}), timers=timers), False, ()
        if verdict.verdict is Verdict.HOLDS:
            changed = replace(canary, phase=CanaryPhase.HELD, **figures)
        else:
            changed = replace(canary, phase=CanaryPhase.FAILED, **figures)
            effects = (ProposeRevert(model, commit, revert_branch(commit), verdict.reason),)
        return replace(state, canaries=frozen({**state.canaries, model: changed})), True, effects

    return transition


def canary_unmeasured(model: str, commit: str, error: str):
    """The transition of a `MeasureCanary` that could not read the usage records (`error`): measured again later."""

    def transition(state: ControlState) -> tuple[ControlState, bool]:
        canary = state.canaries.get(model)
        if canary is None or canary.commit != commit or not canary.measuring:
            return state, False
        due = (canary.check_at or 0.0) + max(MIN_RECHECK, canary.rollout.window / 10)
        changed = replace(canary, measuring=False, check_at=due, reason=f"could not read its requests: {error}")
        return replace(state, canaries=frozen({**state.canaries, model: changed}),
                       timers=(*state.timers, (due, f"canary of {model} measured again"))), False

    return transition


def revert_proposed(model: str, commit: str, branch: str, error: str = ""):
    """The transition of `ProposeRevert`'s outcome: the `branch` holding the revert, or the `error` that kept it
    from being written."""

    def transition(state: ControlState) -> tuple[ControlState, bool]:
        canary = state.canaries.get(model)
        if canary is None or canary.commit != commit:
            return state, False
        changed = replace(canary, revert_branch="" if error else branch, revert_error=error)
        return replace(state, canaries=frozen({**state.canaries, model: changed})), True  # a pass audits it

    return transition


def failed_at(canaries: Mapping[str, Canary], commit: str | None) -> bool:
    """Whether a canary of settings commit `commit` failed (the fleet then does not run that commit: the applied
    ref stays where it was)."""
    return any(c.phase is CanaryPhase.FAILED and c.commit == commit for c in canaries.values())


def canary_line(canary: Canary) -> str:
    """One sentence on `canary` for the audit commit's message and `llmgw status`."""
    head = f"canary of {canary.model} at {canary.commit[:12]} ({canary.replica_id}, {canary.rollout.share:g} of requests)"
    if canary.phase is CanaryPhase.FAILED:
        line = f"{head} failed: {canary.reason}; stopped, the old replicas kept serving"
        if canary.revert_branch:
            line += f"; revert proposed on branch {canary.revert_branch}"
        elif canary.revert_error:
            line += f"; no revert proposed: {canary.revert_error}"
        return line
    if canary.phase is CanaryPhase.HELD:
        return f"{head} held: {canary.reason}; the rest rolls out"
    if canary.ready_at is None:
        return f"{head} starting"
    return f"{head} running" + (f": {canary.reason}" if canary.reason else "")


def canaries_status(canaries: Mapping[str, Canary]) -> dict[str, dict]:
    """The canaries as status.yaml holds them: per model its commit, replica, phase, reason, figures and the
    revert branch."""
    return {name: {"commit": c.commit, "previous_commit": c.previous_commit, "replica": c.replica_id,
                   "share": c.rollout.share, "window_seconds": c.rollout.window, "phase": c.phase.value,
                   "reason": c.reason, "requests": c.requests, "error_rate": c.error_rate,
                   "ttft_p90_seconds": c.ttft_p90, "revert_branch": c.revert_branch or None,
                   "revert_error": c.revert_error or None, "summary": canary_line(c)}
            for name, c in sorted(canaries.items())}

"""Canary rollouts, the pure part: judging a canary by its requests, and what the planner holds while it runs.

A catalog model with `rollout: {strategy: canary, ...}` (`llmgw.settings.model.Rollout`) whose change restarts its
replicas goes out in two steps. First one replica of the new revision (the canary) starts beside the old
replicas, which all keep serving; the gateway sends it `share` of the model's requests. `judge_canary` decides
from the requests it answered (`CanarySample`, read from the gateway's usage records) once `window` seconds
passed since it was ready:

- fewer than `min_requests` requests: wait, up to a second window; then the canary misses ("too little traffic
  to judge"): a revision nobody could check is not rolled out;
- the share of requests answered with a status of 500 or above above `max_error_rate`, or the 90th percentile
  (nearest rank) of time to first token above `max_ttft_p90`: it misses, the reason naming each figure and its
  SLO; a request without a TTFT (not streamed) counts its whole duration, a failed one counts for the error rate
  only;
- else it holds, and the rest of the model rolls out as usual (`reconcile.max_surge` at once).

`CanaryHold` is what the planner (`llmgw.plan.planning.make_plan`, `canaries=`) is told per model: while a canary
runs, only its replica gets the new revision, and that replica's old shard keeps serving beside it; once it
failed, the model is planned as `previous` (the revision the old replicas run), so the canary shard is stopped
and nothing else moves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from llmgw.settings.model import Model, Rollout


@dataclass(frozen=True)
class CanarySample:
    """One request the canary answered, from its usage record: the HTTP `status`, `ttft_seconds` (None: not
    streamed, or failed) and `duration_seconds` (the whole request)."""

    status: int
    ttft_seconds: float | None
    duration_seconds: float


class Verdict(StrEnum):
    WAIT = "wait"
    HOLDS = "holds"
    MISSES = "misses"


@dataclass(frozen=True)
class CanaryVerdict:
    """`judge_canary`'s answer: the `verdict`, a sentence saying why (`reason`), and the figures it read:
    `requests` judged, `error_rate` (0..1; None: no request), `ttft_p90` seconds (None: no successful request)."""

    verdict: Verdict
    reason: str
    requests: int = 0
    error_rate: float | None = None
    ttft_p90: float | None = None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q` (0 < q <= 1) percentile of `values` by nearest rank (the smallest value with at least q of them at or
    below it); None for no values. Pure."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def judge_canary(rollout: Rollout, samples: Sequence[CanarySample], elapsed: float) -> CanaryVerdict:
    """Judge a canary of `rollout` from the `samples` of its requests, `elapsed` seconds after it was ready.

    Returns WAIT before `rollout.window` seconds, or while fewer than `rollout.min_requests` requests came and
    less than two windows passed; else MISSES (naming every SLO missed with its figure, or too little traffic) or
    HOLDS (naming the figures). Pure; the rules are the module's.
    """
    count = len(samples)
    errors = sum(1 for s in samples if s.status >= 500)
    error_rate = errors / count if count else None
    ttfts = [s.ttft_seconds if s.ttft_seconds is not None else s.duration_seconds for s in samples if s.status < 400]
    p90 = percentile(ttfts, 0.9)
    figures = {"requests": count, "error_rate": error_rate, "ttft_p90": p90}
    if elapsed < rollout.window:
        return CanaryVerdict(Verdict.WAIT, f"{count} requests in {elapsed:.0f} s of a {rollout.window:g} s window",
                             **figures)
    if count < rollout.min_requests:
        if elapsed < 2 * rollout.window:
            return CanaryVerdict(Verdict.WAIT, f"{count} of the {rollout.min_requests} requests needed to judge it; "
                                               f"waiting up to a second window", **figures)
        return CanaryVerdict(Verdict.MISSES, f"too little traffic to judge: {count} requests in {elapsed:.0f} s, "
                                             f"{rollout.min_requests} needed (rollout.min_requests)", **figures)
    missed = []
    if rollout.max_error_rate is not None and error_rate is not None and error_rate > rollout.max_error_rate:
        missed.append(f"error rate {error_rate:.1%} ({errors} of {count} requests answered 5xx) above the SLO's "
                      f"{rollout.max_error_rate:.1%}")
    if rollout.max_ttft_p90 is not None and (p90 is None or p90 > rollout.max_ttft_p90):
        missed.append(f"TTFT p90 {'unknown (no request succeeded)' if p90 is None else _seconds(p90)} above the "
                      f"SLO's {_seconds(rollout.max_ttft_p90)}")
    if missed:
        return CanaryVerdict(Verdict.MISSES, "; ".join(missed) + f" over {count} requests", **figures)
    held = [f"error rate {error_rate:.1%}"]
    if p90 is not None:
        held.append(f"TTFT p90 {_seconds(p90)}")
    return CanaryVerdict(Verdict.HOLDS, ", ".join(held) + f" over {count} requests: within the SLO", **figures)


@dataclass(frozen=True)
class CanaryHold:
    """What the planner is told about one model's canary (see the module).

    `replica_id`: the replica whose new generation is the canary. `failed`: the canary missed its SLO; the model is
    then planned as `previous` (its definition in the settings the old replicas run) and `reason` says why it
    stops. `commit`: the settings commit of the revision under test; `previous_commit`: the settings commit whose
    definition of the model `previous` is (what an audit commit records, so `llmgw plan --at` loads it again).
    """

    replica_id: str
    commit: str
    failed: bool = False
    previous: Model | None = None
    reason: str = ""
    previous_commit: str | None = None

    def to_json(self) -> dict:
        """As `plan/pass.json` records it (`llmgw.plan.recorded`): without `previous`, named by its commit."""
        return {"replica": self.replica_id, "commit": self.commit, "failed": self.failed, "reason": self.reason,
                "previous_commit": self.previous_commit}

"""Canary rollouts, the pure part: the verdict from a canary's requests (`judge_canary`), and what the planner does
while a canary runs or after it failed (`make_plan(canaries=...)`), in tables and over 60 seeded random fleets.

Rules checked on every seed (the model "m" changed its engine arguments; old shards run the old fingerprint):
- while its canary runs, no replica but the canary's gets a shard of the new revision, and no READY shard of the old
  revision is stopped (the old replicas keep serving; the canary's old shard serves beside it);
- once it failed, nothing of the new revision is started, the only shards of "m" stopped are of the new revision
  (or not healthy), and every READY old shard is kept;
- another model's running shards are kept or stopped exactly as without the canary (where its new replicas go may
  differ: the canary's old shard holds its room).
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from plan_fleets import GiB, cpu_node, fleet, model, settings, shard

from llmgw.plan import ActionKind, ShardState, fingerprint, make_plan
from llmgw.plan.canary import CanaryHold, CanarySample, Verdict, judge_canary, percentile
from llmgw.settings.model import Rollout

CANARY = Rollout("canary", share=0.1, window=600.0, min_requests=10, max_error_rate=0.05, max_ttft_p90=2.0)


def ok(ttft: float = 0.5, status: int = 200) -> CanarySample:
    return CanarySample(status, ttft, ttft + 1.0)


@pytest.mark.parametrize("samples, elapsed, verdict, reason", [
    ([ok()] * 20, 599.0, Verdict.WAIT, "20 requests in 599 s of a 600 s window"),
    ([ok()] * 5, 600.0, Verdict.WAIT, "5 of the 10 requests needed to judge it; waiting up to a second window"),
    ([ok()] * 5, 1200.0, Verdict.MISSES, "too little traffic to judge: 5 requests in 1200 s, 10 needed"),
    ([ok()] * 20, 600.0, Verdict.HOLDS, "error rate 0.0%, TTFT p90 500 ms over 20 requests: within the SLO"),
    # the 90th percentile by nearest rank: 2 slow of 20 is p90 fast, 3 of 20 is p90 slow
    ([ok()] * 18 + [ok(2.5)] * 2, 600.0, Verdict.HOLDS, "TTFT p90 500 ms"),
    ([ok()] * 17 + [ok(2.5)] * 3, 600.0, Verdict.MISSES, "TTFT p90 2.50 s above the SLO's 2.00 s over 20 requests"),
    # 5xx count as errors, 4xx (the client's) do not, and a failed request has no TTFT
    ([ok()] * 18 + [ok(status=502)] * 2, 600.0, Verdict.MISSES,
     "error rate 10.0% (2 of 20 requests answered 5xx) above the SLO's 5.0% over 20 requests"),
    ([ok()] * 18 + [CanarySample(429, None, 30.0)] * 2, 600.0, Verdict.HOLDS, "error rate 0.0%"),
    ([ok(status=500)] * 10, 600.0, Verdict.MISSES, "TTFT p90 unknown (no request succeeded)"),
    # not streamed: the whole answer is the time to the first token
    ([CanarySample(200, None, 3.0)] * 10, 600.0, Verdict.MISSES, "TTFT p90 3.00 s above"),
])
def test_a_canary_is_judged_by_its_requests_after_its_window(samples, elapsed, verdict, reason):
    judged = judge_canary(CANARY, samples, elapsed)
    assert judged.verdict is verdict and reason in judged.reason, judged


def test_only_the_slos_given_are_checked():
    errors_only = replace(CANARY, max_ttft_p90=None)
    assert judge_canary(errors_only, [ok(30.0)] * 10, 600.0).verdict is Verdict.HOLDS
    ttft_only = replace(CANARY, max_error_rate=None)
    assert judge_canary(ttft_only, [ok()] * 5 + [ok(status=503)] * 5, 600.0).verdict is Verdict.HOLDS


@pytest.mark.parametrize("values, q, expected", [
    ([], 0.9, None), ([3.0], 0.9, 3.0), ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.9, 9), ([10, 1, 5], 0.5, 5),
    (list(range(1, 101)), 0.9, 90), (list(range(1, 102)), 0.9, 91),
])
def test_percentiles_go_by_nearest_rank(values, q, expected):
    assert percentile(values, q) == expected


OLD = model("m", replicas=3, cores=1, memory=GiB)
NEW = replace(OLD, engine_args=("--threads", "1"), rollout=CANARY)
OTHER = model("other", replicas=2, cores=1, memory=GiB)


def fp(m) -> str:
    return fingerprint(m, "b11434")


def new_shard(n: int, state: ShardState = ShardState.READY):
    return shard(NEW, n, state=state, shard_id=f"m-{n}/0@{fp(NEW)[:8]}")


def kinds(plan, model_name: str = "m") -> list[tuple[str, str]]:
    return [(a.kind.value, a.shard_id) for a in plan.actions if a.model == model_name]


def test_a_running_canary_starts_its_replica_alone_and_keeps_every_old_shard_serving():
    old = [shard(OLD, n) for n in range(3)]
    hold = {"m": CanaryHold("m-0", "b" * 40)}
    plan = make_plan(settings(NEW), fleet(cpu_node("n1", shards=old)), canaries=hold)
    assert [k for k in kinds(plan) if k[0] != "keep"] == [("start", f"m-0/0@{fp(NEW)[:8]}")]
    assert [u.replica_id for u in plan.unplaced] == ["m-1", "m-2"]
    assert "canary: waits for the verdict on m-0" in str(plan.unplaced[0])

    # ready: its old shard serves beside it until the verdict (without the canary it would stop)
    running = fleet(cpu_node("n1", shards=[*old, new_shard(0)]))
    plan = make_plan(settings(NEW), running, canaries=hold)
    assert [k for k in kinds(plan) if k[0] != "keep"] == []
    beside = next(a for a in plan.actions if a.shard_id == "m-0/0")
    assert beside.reason == f"canary: serves beside m-0/0@{fp(NEW)[:8]} until the canary's verdict"
    rolled = make_plan(settings(NEW), running)  # held: the rest rolls (max_surge 1)
    assert ("stop", "m-0/0") in kinds(rolled) and ("start", f"m-1/0@{fp(NEW)[:8]}") in kinds(rolled)


def test_a_failed_canary_stops_its_shard_with_the_reason_and_nothing_else_moves():
    hold = {"m": CanaryHold("m-0", "b" * 40, failed=True, previous=OLD, reason="TTFT p90 3.10 s above the SLO's 2.00 s")}
    f = fleet(cpu_node("n1", shards=[*(shard(OLD, n) for n in range(3)), new_shard(0)]))
    plan = make_plan(settings(NEW), f, canaries=hold)
    stop = [a for a in plan.actions if a.kind is ActionKind.STOP]
    assert [(a.shard_id, a.reason) for a in stop] == [
        (f"m-0/0@{fp(NEW)[:8]}", "canary of bbbbbbbbbbbb failed: TTFT p90 3.10 s above the SLO's 2.00 s")]
    assert not plan.unplaced and {a.fingerprint for a in plan.assignments} == {fp(OLD)}
    assert plan.settings_commit == settings(NEW).commit


def random_case(rng: random.Random):
    """A fleet of 1-3 nodes running "m" (old revision, some replicas with new-revision shards in any state, some
    old shards not healthy) and "other"; and a hold of "m", running or failed."""
    replicas = rng.randint(1, 5)
    new = replace(NEW, replicas=replicas)
    old = replace(OLD, replicas=replicas)
    nodes = [[] for _ in range(rng.randint(1, 3))]
    for n in range(replicas):
        if rng.random() < 0.9:
            nodes[rng.randrange(len(nodes))].append(shard(old, n, state=rng.choice(
                [ShardState.READY] * 4 + [ShardState.STARTING, ShardState.FAILED])))
        if rng.random() < 0.4:
            nodes[rng.randrange(len(nodes))].append(shard(new, n, state=rng.choice(list(ShardState)),
                                                          shard_id=f"m-{n}/0@{fp(new)[:8]}"))
    for n in range(OTHER.replicas):
        if rng.random() < 0.7:
            nodes[rng.randrange(len(nodes))].append(shard(OTHER, n))
    f = fleet(*(cpu_node(f"n{i}", cores=rng.choice([2, 4, 8]), shards=s) for i, s in enumerate(nodes)))
    failed = rng.random() < 0.5
    hold = CanaryHold("m-0", "b" * 40, failed=failed, previous=old if failed else None, reason="slow")
    return settings(new, OTHER), f, hold, old


@pytest.mark.parametrize("seed", range(60))
def test_canary_holds_keep_the_old_revision_serving_on_random_fleets(seed):
    s, f, hold, old = random_case(random.Random(seed))
    plan = make_plan(s, f, canaries={"m": hold})
    new_fp, old_fp = fp(s.models["m"]), fp(old)
    by_id = {sh.shard_id: sh for node in f.nodes for sh in node.shards}
    starts = [a for a in plan.actions if a.model == "m" and a.kind in (ActionKind.START, ActionKind.RESTART)]
    stops = [by_id[a.shard_id] for a in plan.actions if a.model == "m" and a.kind is ActionKind.STOP]
    if not hold.failed:
        assert all(a.replica_id == "m-0" for a in starts
                   if (a.assignment and a.assignment.fingerprint == new_fp)), plan.actions
        assert not [sh for sh in stops if sh.fingerprint == old_fp and sh.state is ShardState.READY], plan.actions
    else:
        assert not [a for a in starts if a.assignment and a.assignment.fingerprint == new_fp], plan.actions
        assert all(sh.fingerprint == new_fp or sh.state is not ShardState.READY for sh in stops), plan.actions
    plain = make_plan(s, f)
    def judged(p):
        return [a for a in p.actions if a.model == "other" and a.kind in (ActionKind.KEEP, ActionKind.STOP)]
    assert judged(plan) == judged(plain)

"""The forecast of a settings change (`llmgw.plan.forecasting`): figures worked out by hand on small fleets, and
rules checked on 60 seeded fleets.

Rules (each seed varies the fleet, the catalog, the replica counts before and after, the measured speeds, the
traffic's size, mix and busiest hour, and whether TTFTs were measured):
- GPU-hours per day are 24 x the GPUs of the replicas ready now (before) and of those HEAD's plan places (after).
- Capacity is proportional to the replicas placed; expected tokens/s is at most the capacity and the demand.
- TTFT p90 after is None exactly when the model is overloaded (utilisation >= SATURATED) or cannot be forecast;
  with more replicas after, never higher than with fewer.
- A figure is unknown (None) only with a reason in `unknown`.
- Quota use is never negative, and the requests per minute of the projects of a model's only traffic add up to the
  model's busiest-hour rate.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from plan_fleets import GiB, LLAMA, apply_plan, cpu_node, fleet, gpu_node, model, settings

from llmgw.errors import UsageError
from llmgw.identity import Quota
from llmgw.plan import make_plan
from llmgw.plan.forecasting import (
    SATURATED, ModelLoad, RecordedLoad, Traffic, changed_models, forecast_change, forecast_model, forecast_to_json,
)
from llmgw.plan.forecast_check import check_forecast
from llmgw.plan.snapshot import FleetSnapshot, snapshot_from_json, snapshot_to_json
from llmgw.routes import ReplicaSpeed
from llmgw.settings.model import ClusterSettings, Project, frozen_map

DAY = 86400.0


def with_projects(s, **quotas):
    projects = {name: Project(name, "t", "o", models=("*",), quota=q) for name, q in quotas.items()}
    return replace(s, projects=frozen_map(projects))


def cpu_case(replicas_before: int, replicas_after: int):
    """m on a CPU node: `replicas_before` ready now, HEAD wants `replicas_after`."""
    base = settings(model("m", replicas=replicas_before, cores=1, memory=GiB))
    now = apply_plan(make_plan(base, fleet(cpu_node("n1", cores=16, memory=64 * GiB))),
                     fleet(cpu_node("n1", cores=16, memory=64 * GiB)))
    head = settings(model("m", replicas=replicas_after, cores=1, memory=GiB))
    return base, head, now, make_plan(head, now)


def test_a_second_replica_halves_the_load_and_the_forecast_says_by_how_much():
    base, head, now, plan = cpu_case(1, 2)
    head = with_projects(head, a=Quota(requests_per_minute=60, tokens_per_day=1_000_000), b=Quota())
    load = RecordedLoad(
        window_seconds=DAY, speeds={"m-0": ReplicaSpeed(prefill_tokens_per_second=1000.0,
                                                         decode_tokens_per_second=50.0)},
        traffic=(Traffic("m", "a", 3000, 300_000, 150_000), Traffic("m", "b", 1000, 100_000, 50_000)),
        models={"m": ModelLoad("m", busiest_hour_requests=720, ttft_p90_seconds=0.5, ttft_requests=4000)})
    f = forecast_model("m", base, head, now, plan, load)
    # p = 100, c = 50 tokens; λ = 720 / 3600 = 0.2/s; s = 100/1000 + 50/50 = 1.1 s of a replica per request
    assert (f.replicas_before, f.replicas_after) == (1, 2)
    assert f.requests_per_second == pytest.approx(0.2)
    assert f.demand_tokens_per_second == pytest.approx(10.0)
    assert f.capacity_before == pytest.approx(50 / 1.1) and f.capacity_after == pytest.approx(100 / 1.1)
    assert f.expected_tokens_per_second == pytest.approx(10.0)
    assert f.utilisation_before == pytest.approx(0.22) and f.utilisation_after == pytest.approx(0.11)
    # t0 = 0.5 x (1 - 0.22) = 0.39 s; after = 0.39 / (1 - 0.11)
    assert f.ttft_p90_before == 0.5 and f.ttft_p90_after == pytest.approx(0.39 / 0.89)
    assert (f.gpu_hours_per_day_before, f.gpu_hours_per_day_after) == (0.0, 0.0)
    assert f.unknown == () and not f.overloaded
    quotas = {q.project: q for q in f.quotas}
    # a: 3/4 of the model's busiest-hour requests: 0.15/s = 9 per minute, 150 tokens each; 450,000 tokens a day
    assert quotas["a"].requests_per_minute == pytest.approx(9.0)
    assert quotas["a"].tokens_per_minute == pytest.approx(9.0 * 150)
    assert quotas["a"].tokens_per_day == pytest.approx(450_000)
    assert quotas["a"].shares() == pytest.approx({"requests_per_minute": 0.15, "tokens_per_day": 0.45})
    assert quotas["b"].shares() == {} and quotas["b"].requests_per_minute == pytest.approx(3.0)
    assert json.loads(json.dumps(forecast_to_json(f)))["ttft_p90_after"] == pytest.approx(0.39 / 0.89)


def test_taking_replicas_away_from_a_busy_model_is_forecast_as_overloaded():
    base, head, now, plan = cpu_case(2, 1)
    load = RecordedLoad(window_seconds=DAY, speeds={"m-0": ReplicaSpeed(1000.0, 50.0), "m-1": ReplicaSpeed(1000.0, 30.0)},
                        traffic=(Traffic("m", "a", 1000, 100_000, 100_000),),
                        models={"m": ModelLoad("m", busiest_hour_requests=3600)})
    f = forecast_model("m", base, head, now, plan, load)
    # the mean replica: decode 40 tokens/s; s = 0.1 + 2.5 = 2.6 s; λ = 1/s: utilisation 1.3 now, 2.6 after
    assert f.utilisation_after == pytest.approx(2.6) and f.overloaded
    assert f.ttft_p90_after is None and f.ttft_p90_before is None
    assert f.expected_tokens_per_second == pytest.approx(f.capacity_after) == pytest.approx(100 / 2.6)


def test_a_model_never_measured_or_never_used_is_not_forecast_and_says_why():
    base = settings(model("g", replicas=0, gpus=2, gpu_class="h100-80g", tp=2))
    head = settings(model("g", replicas=2, gpus=2, gpu_class="h100-80g", tp=2))
    head = replace(head, cluster=ClusterSettings(name="test", gpu_hour_cost=frozen_map({"default": 2.0})))
    f0 = fleet(gpu_node("n1", engines=(LLAMA,)))
    plan = make_plan(head, f0)
    f = forecast_model("g", base, head, f0, plan, RecordedLoad(window_seconds=DAY))
    assert f.replicas_after == 2 and f.gpu_hours_per_day_after == 96.0 and f.cost_per_day_after == 192.0
    assert f.cost_per_day_before is None
    assert f.capacity_after is None and f.ttft_p90_after is None and f.expected_tokens_per_second is None
    assert f.unknown == ("no traffic recorded in the window",
                         "no measured speed (run `llmgw bench` on a replica of it)")


def test_only_the_models_the_change_touches_are_forecast():
    base, head, now, plan = cpu_case(1, 1)
    head2 = replace(head, models=frozen_map({**head.models, "new": model("new", replicas=1)}))
    assert changed_models(base, head, plan) == ()
    assert changed_models(base, head2, make_plan(head2, now)) == ("new",)
    assert forecast_change(base, head, now, plan, RecordedLoad(window_seconds=DAY)) == ()


def random_case(seed: int):
    rng = random.Random(seed)
    nodes = [gpu_node(f"n{i}", count=rng.choice([2, 4, 8]), engines=(LLAMA,)) for i in range(rng.randint(1, 3))]
    nodes += [cpu_node(f"c{i}", cores=rng.choice([4, 16]), memory=64 * GiB) for i in range(rng.randint(0, 2))]
    names = [f"m{i}" for i in range(rng.randint(1, 4))]
    gpus = {n: rng.choice([0, 1, 2]) for n in names}

    def catalog(counts):
        return settings(*(model(n, replicas=counts[n], gpus=gpus[n], gpu_class="h100-80g" if gpus[n] else None,
                                tp=max(gpus[n], 1), cores=1, memory=GiB) for n in names))

    base = catalog({n: rng.randint(0, 3) for n in names})
    head = catalog({n: rng.randint(0, 4) for n in names})
    projects = {f"p{j}": Quota(requests_per_minute=rng.choice([None, 10, 1000]),
                               tokens_per_day=rng.choice([None, 10_000, 10**8])) for j in range(rng.randint(1, 3))}
    head = with_projects(head, **projects)
    now = apply_plan(make_plan(base, fleet(*nodes)), fleet(*nodes))
    replicas = sorted({s.replica_id for n in now.nodes for s in n.shards})
    speeds = {r: ReplicaSpeed(rng.uniform(50, 5000), rng.uniform(5, 500)) for r in replicas if rng.random() < 0.8}
    traffic = tuple(Traffic(n, p, (req := rng.randint(0, 20000)), req * rng.randint(0, 2000), req * rng.randint(0, 500))
                    for n in names for p in projects if rng.random() < 0.7)
    models = {n: ModelLoad(n, rng.choice([0, rng.randint(1, 5000)]),
                           rng.choice([None, rng.uniform(0.01, 5)]), 100) for n in names}
    load = RecordedLoad(rng.choice([3600.0, DAY, 3 * DAY]), "", speeds, traffic, models)
    return base, head, now, load


@pytest.mark.parametrize("seed", range(60))
def test_forecast_rules_hold_on_seeded_fleets(seed):
    base, head, now, load = random_case(seed)
    plan = make_plan(head, now, allow_empty=True)
    forecasts = forecast_change(base, head, now, plan, load)
    assert [f.model for f in forecasts] == sorted(changed_models(base, head, plan))
    for f in forecasts:
        ready = {(s.replica_id, len(s.devices)) for n in now.nodes if n.alive for s in n.shards if s.model == f.model}
        placed = {a.replica_id: len(a.devices) for a in plan.assignments if a.model == f.model}
        assert f.gpu_hours_per_day_before == 24 * sum(g for _, g in ready)
        assert f.gpu_hours_per_day_after == 24 * sum(placed.values()) and f.replicas_after == len(placed)
        for value in (f.capacity_after, f.expected_tokens_per_second, f.utilisation_after, f.ttft_p90_after):
            assert value is not None or f.unknown or f.overloaded
        if f.capacity_after is not None:
            if f.replicas_before and f.capacity_before:
                assert f.capacity_after / f.replicas_after == pytest.approx(f.capacity_before / f.replicas_before) \
                    if f.replicas_after else f.capacity_after == 0
            assert f.expected_tokens_per_second <= f.capacity_after + 1e-9
            assert f.expected_tokens_per_second <= f.demand_tokens_per_second + 1e-9
        if f.utilisation_after is not None:
            assert (f.ttft_p90_after is None) == (f.utilisation_after >= SATURATED)
        more = forecast_model(f.model, base, head, now, replace(plan, assignments=plan.assignments + tuple(
            replace(a, replica_id=a.replica_id + "-extra") for a in plan.assignments if a.model == f.model)), load)
        if f.ttft_p90_after is not None and more.ttft_p90_after is not None:
            assert more.ttft_p90_after <= f.ttft_p90_after + 1e-12
        for q in f.quotas:
            assert min(q.requests_per_minute, q.tokens_per_minute, q.tokens_per_day) >= 0
        own = [t for t in load.traffic if t.model == f.model]
        if own and all(t.model == f.model for t in load.traffic if t.project in {x.project for x in own}):
            users = {q.project: q.requests_per_minute for q in f.quotas}
            assert sum(users[t.project] for t in own if t.project in users) == pytest.approx(
                f.requests_per_second * 60 if sum(t.requests for t in own) else 0.0)
        json.dumps(forecast_to_json(f), allow_nan=False)


def test_a_snapshot_carries_its_load_and_keeps_the_revision_of_its_nodes():
    base, head, now, load = random_case(7)
    plain = FleetSnapshot(now, "2026-12-01T02:00:00Z", "c" * 40)
    loaded = replace(plain, load=load)
    doc = json.loads(json.dumps(snapshot_to_json(loaded)))
    back = snapshot_from_json(doc)
    assert back.revision == plain.revision and "load" not in snapshot_to_json(plain)
    assert snapshot_to_json(back) == snapshot_to_json(loaded)


@pytest.mark.parametrize("bad, message", [
    ({"window_seconds": 0}, "load.window_seconds: expected seconds above 0, got 0"),
    ({"window_seconds": 60, "traffic": [{"model": "m", "project": "p", "requests": -1}]},
     "load.traffic[0].requests: expected a count (0 or more), got -1"),
    ({"window_seconds": 60, "speeds": {"m-0": {"prefill_tokens_per_second": 10}}},
     "load.speeds.m-0.decode_tokens_per_second: missing"),
    ({"window_seconds": 60, "models": {"m": {"ttft_p90_seconds": "fast"}}},
     "load.models.m.ttft_p90_seconds: expected"),
])
def test_a_bad_load_in_a_snapshot_is_refused_naming_the_key(bad, message):
    doc = {"version": 1, "nodes": [], "load": bad}
    with pytest.raises(UsageError) as raised:
        snapshot_from_json(doc, "fleet.json")
    assert str(raised.value).startswith("fleet.json is not a fleet snapshot: " + message)


def test_a_forecast_is_checked_against_the_load_measured_after_the_change():
    forecast = [{"model": "m", "requests_per_second": 0.2, "expected_tokens_per_second": 10.0, "ttft_p90_after": 0.5},
                {"model": "quiet", "requests_per_second": 1.0, "expected_tokens_per_second": None,
                 "ttft_p90_after": None}]
    hour = RecordedLoad(window_seconds=7200.0, traffic=(Traffic("m", "a", 600, 60_000, 24_000),),
                        models={"m": ModelLoad("m", busiest_hour_requests=900, ttft_p90_seconds=0.6)})
    m, quiet = check_forecast(forecast, hour)
    # busiest hour: 900 / 3600 = 0.25 requests/s of 40 completion tokens each
    assert (m.requests, m.rate_measured, m.tokens_measured, m.ttft_p90_measured) == (600, 0.25, 10.0, 0.6)
    assert m.rate_error == pytest.approx(0.25) and m.tokens_error == 0.0 and m.ttft_p90_error == pytest.approx(0.2)
    assert (quiet.requests, quiet.rate_measured, quiet.tokens_error, quiet.ttft_p90_error) == (0, None, None, None)
    short = replace(hour, window_seconds=1200.0)  # under an hour: the window's mean rate, 0.5 requests/s
    (m, _) = check_forecast(forecast, short)
    assert m.rate_measured == 0.5 and m.tokens_measured == 20.0 and m.tokens_error == pytest.approx(1.0)
    assert json.loads(json.dumps(m.to_json()))["tokens_error"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="ttft_p90_after is 'fast', not a number"):
        check_forecast([{**forecast[0], "ttft_p90_after": "fast"}], hour)

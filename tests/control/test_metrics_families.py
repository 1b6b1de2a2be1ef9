"""The metric families are a pure function of one ControlState: stale or unread readings are absent (never 0 nor
repeated), clock-event bits become one series per NVML reason, lost nodes count as lost, replicas are ready only
when every shard is, and the tallies count passes, their duration and actions by outcome."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmgw.control.metrics import control_families
from llmgw.control.metrics_fleet import fleet_families
from llmgw.control.readings import GpuSample, NodeReadings, ShardReading
from llmgw.control.registry import FleetRegistry, NodeRecord
from llmgw.control.state import ControlState, PassRecord
from llmgw.control.tallies import PASS_SECONDS_BUCKETS, Tallies
from llmgw.identity import ShardState
from llmgw.plan.types import GpuState, NodeState, ObservedShard
from llmgw.tools.engine_metrics import EngineLoad


def shard(shard_id: str, replica: str, state: ShardState, restarts: int = 0) -> ObservedShard:
    return ObservedShard(shard_id=shard_id, replica_id=replica, model="big", state=state, restarts=restarts)


def record(node_id: str = "g1", *, at: float = 100.0, lost: bool = False, gpu: GpuSample | None = None,
           shards: tuple[ObservedShard, ...] = ()) -> NodeRecord:
    gpus = (GpuState(device_id="0", gpu_class="h200-141g", memory_total_bytes=150 << 30, memory_free_bytes=0),)
    readings = NodeReadings(at=at, cpu_percent=50.0, load1=1.5, memory_used_bytes=8 << 30,
                            gpus=(gpu or GpuSample(index=0, power_draw_watts=690.0, power_limit_watts=700.0),),
                            shards=tuple(ShardReading(s.shard_id, 0.5, 1 << 30) for s in shards))
    return NodeRecord(state=NodeState(node_id=node_id, cpu_cores=8, gpus=gpus, shards=shards), last_seen=at,
                      lost=lost, connected=not lost, readings=readings)


def scrape(records: list[NodeRecord], now: float) -> dict[tuple[str, frozenset], float]:
    fleet = FleetRegistry(lost_after=30.0, records={r.node_id: r for r in records})
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in fleet_families(fleet, None, now) for s in family.samples}


def names(found: dict) -> set[str]:
    return {name for name, _ in found}


@pytest.mark.parametrize(("now", "present"), [(100.0, True), (160.0, True), (160.1, False), (1000.0, False)])
def test_readings_older_than_a_minute_are_absent_from_the_scrape(now, present):
    found = scrape([record(at=100.0)], now)
    for name in ("llmgw_node_load1", "llmgw_node_cpu_usage_ratio", "llmgw_gpu_power_watts",
                 "llmgw_node_readings_age_seconds"):
        assert (name in names(found)) is present, name
    assert ("llmgw_node_up", frozenset({("node", "g1")})) in found  # the node itself is still there


def test_a_reading_the_agent_could_not_take_is_absent_not_zero():
    found = scrape([record(gpu=GpuSample(index=0, temperature_celsius=None, utilization_percent=37.0))], 100.0)
    assert "llmgw_gpu_temperature_celsius" not in names(found)
    assert "llmgw_node_disk_free_bytes" not in names(found)
    labels = frozenset({("node", "g1"), ("gpu", "0"), ("gpu_class", "h200-141g")})
    assert found[("llmgw_gpu_utilization_ratio", labels)] == pytest.approx(0.37)


def test_clock_event_reasons_become_one_series_per_nvml_reason():
    found = scrape([record(gpu=GpuSample(index=0, clock_event_reasons=0x4 | 0x40))], 100.0)
    active = {dict(labels)["reason"] for (name, labels), v in found.items()
              if name == "llmgw_gpu_clock_event_active" and v == 1}
    every = {dict(labels)["reason"] for (name, labels) in found if name == "llmgw_gpu_clock_event_active"}
    assert active == {"sw_power_cap", "hw_thermal_slowdown"} and len(every) == 9


def test_a_lost_node_counts_as_lost_and_its_shards_are_not_exported():
    found = scrape([record("g1", lost=True, shards=(shard("big-0/0", "big-0", ShardState.READY),)),
                    record("g2")], 100.0)
    assert found[("llmgw_nodes", frozenset({("state", "lost")}))] == 1
    assert found[("llmgw_nodes", frozenset({("state", "connected")}))] == 1
    assert found[("llmgw_node_up", frozenset({("node", "g1")}))] == 0
    assert not [key for key in found if key[0] == "llmgw_shard_state" and ("node", "g1") in key[1]]


def test_a_replica_is_ready_only_when_every_shard_is():
    shards = (shard("big-0/0", "big-0", ShardState.READY), shard("big-0/1", "big-0", ShardState.STARTING),
              shard("big-1/0", "big-1", ShardState.READY, restarts=3))
    found = scrape([record(shards=shards)], 100.0)
    assert found[("llmgw_model_replicas_ready", frozenset({("model", "big")}))] == 1
    restarts = frozenset({("node", "g1"), ("model", "big"), ("replica", "big-1"), ("shard", "big-1/0")})
    assert found[("llmgw_shard_restarts_total", restarts)] == 3
    assert found[("llmgw_shard_resident_memory_bytes", restarts)] == 1 << 30


def test_tallies_count_passes_by_outcome_their_duration_and_actions_by_outcome():
    tallies = Tallies().counted_pass(True, 0.003, ("start", "start")).counted_pass(False, 99.0, ())
    tallies = tallies.counted_outcome("start", "succeeded").counted_outcome("start", "failed")
    assert dict(tallies.passes) == {"converged": 1, "not_converged": 1} and tallies.pass_count == 2
    cumulative = dict(tallies.cumulative_buckets())
    assert cumulative[0.0025] == 0 and cumulative[0.005] == 1 and cumulative[PASS_SECONDS_BUCKETS[-1]] == 1
    assert cumulative[float("inf")] == 2 and tallies.pass_seconds_sum == pytest.approx(99.003)
    state = replace(ControlState(), tallies=tallies,
                    last_pass=PassRecord(number=2, trigger="t", settings_commit=None, started_at=5.0, duration=0.0))
    found = {(s.name, frozenset(s.labels.items())): s.value for f in control_families(state) for s in f.samples}
    assert found[("llmgw_control_actions_total", frozenset({("kind", "start"), ("outcome", "sent")}))] == 2
    assert found[("llmgw_control_actions_total", frozenset({("kind", "start"), ("outcome", "failed")}))] == 1
    assert found[("llmgw_control_pass_duration_seconds_count", frozenset())] == 2
    assert found[("llmgw_control_converged", frozenset())] == 0
    assert found[("llmgw_control_last_pass_timestamp_seconds", frozenset())] == 5.0


def test_an_engines_own_load_is_exported_per_shard_and_what_it_does_not_publish_is_absent():
    shards = (shard("big-0/0", "big-0", ShardState.READY), shard("big-1/0", "big-1", ShardState.READY))
    base = record(shards=shards)
    load = EngineLoad(requests_running=2.0, requests_waiting=5.0, kv_cache_usage=0.25, prompt_tokens_total=900.0,
                      generation_tokens_total=80.0)
    readings = replace(base.readings, shards=(ShardReading("big-0/0", 0.5, 1 << 30, load),
                                              ShardReading("big-1/0", 0.5, 1 << 30)))  # not read: no engine load
    found = scrape([replace(base, readings=readings)], 100.0)
    labels = frozenset({("node", "g1"), ("model", "big"), ("replica", "big-0"), ("shard", "big-0/0")})
    assert found[("llmgw_engine_requests_running", labels)] == 2
    assert found[("llmgw_engine_requests_waiting", labels)] == 5
    assert found[("llmgw_engine_kv_cache_usage_ratio", labels)] == 0.25
    assert found[("llmgw_engine_prompt_tokens_total", labels)] == 900
    assert found[("llmgw_engine_generation_tokens_total", labels)] == 80
    engine_series = [key for key in found if key[0].startswith("llmgw_engine_")]
    assert len(engine_series) == 5  # big-1's engine was not read, big-0's publishes no prefix-cache counters
    assert not [key for key in scrape([replace(base, readings=readings)], 161.0) if key[0].startswith("llmgw_engine")]

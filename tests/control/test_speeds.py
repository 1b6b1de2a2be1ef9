"""Measured speed from `llmgw bench`'s results into the routing table: the latest engine run of each replica gives
its prefill and decode speed; the table's replicas carry them; the control plane's reader hands them to the feed
from a real store, and a table with them is handed to the gateways again only when they changed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import trio
import trio.testing

from llmgw.control.feeding import GatewayFeed
from llmgw.control.opening import read_speeds
from llmgw.control.routing import build_route_table
from llmgw.control.speeds import speed_of_bench, speeds_from_benches
from llmgw.control.registry import FleetRegistry
from llmgw.control.state import ControlState, WatchState
from llmgw.routes import ReplicaSpeed
from llmgw.store import BenchRecord, open_store

from support.waiting import wait_in_real_time
from .test_route_table import SECRET, fleet, replica_key, settings


def _bench(replica: str, when: float, decode: float | None, *, via: str = "engine", concurrency: int = 2,
           ttft: float | None = 0.5) -> BenchRecord:
    return BenchRecord(when, replica, "gemma", "n1", "cpu 16 cores", "b11434", via, 256, 64, concurrency, 8, ttft,
                       ttft, 0.02, 90.0, {"decode_tokens_per_second": {"p50": decode}, "engine_slots": 4})


def test_the_latest_engine_run_of_each_replica_gives_its_speed():
    assert speed_of_bench(_bench("gemma-0", 10.0, 50.0)) == ReplicaSpeed(
        prefill_tokens_per_second=256 / 0.5 * 2, decode_tokens_per_second=100.0, slots=4, measured_at=10.0,
        source="bench")
    records = [_bench("gemma-0", 10.0, 50.0), _bench("gemma-0", 30.0, 40.0, concurrency=1),
               _bench("gemma-0", 40.0, None),  # every request failed: no figure, the earlier run stands
               _bench("gemma-1", 20.0, 500.0), _bench("gateway/gemma", 50.0, 70.0, via="gateway"),
               _bench("gemma-2", 20.0, 9.0, ttft=None)]
    speeds = speeds_from_benches(records)
    assert set(speeds) == {"gemma-0", "gemma-1"}
    assert (speeds["gemma-0"].decode_tokens_per_second, speeds["gemma-0"].measured_at) == (40.0, 30.0)


def test_the_table_carries_each_measured_replicas_speed():
    speed = ReplicaSpeed(1000.0, 80.0, measured_at=5.0, source="bench")
    table = build_route_table(settings(), fleet(), lambda rid: replica_key(SECRET, rid), speeds={"gemma-1": speed})
    assert [(r.replica_id, r.speed) for r in table.models["gemma"].replicas] == [("gemma-0", None), ("gemma-1", speed)]


class _Gateway:
    def __init__(self) -> None:
        self.tables = []

    def set_table(self, table) -> None:
        self.tables.append(table)


@pytest.mark.parametrize("autojump_clock", [trio.testing.MockClock(autojump_threshold=0)])
async def test_the_reader_hands_the_feed_the_stores_speeds_and_the_gateway_a_new_table_only_on_a_change(
        tmp_path, autojump_clock):
    store = open_store(tmp_path / "llmgw.sqlite3")
    gateway = _Gateway()
    feed = GatewayFeed(lambda rid: replica_key(SECRET, rid), lambda name: None)
    feed.attach(gateway)
    registry = FleetRegistry(lost_after=30.0)
    for node in fleet().nodes:
        registry, _ = registry.register(node, now=0.0)
    state = replace(ControlState(), watch=WatchState(settings=settings()), fleet=registry)
    feed.publish_now(state)
    handed = len(gateway.tables)
    plane = type("Plane", (), {"feed": feed, "loop": type("Loop", (), {"state": state})()})()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_speeds, plane, store, 60.0)
            await trio.sleep(1)
            assert feed.speeds == {} and len(gateway.tables) == handed  # nothing measured: nothing new to hand
            store.record_bench(_bench("gemma-0", 10.0, 50.0))
            await wait_in_real_time(lambda: "gemma-0" in feed.speeds, 30, "the next read of the bench results")
            assert feed.speeds["gemma-0"].decode_tokens_per_second == 100.0
            assert len(gateway.tables) == handed + 1
            assert [r.speed and r.speed.decode_tokens_per_second for r in gateway.tables[-1].models["gemma"].replicas
                    ] == [100.0, None]
            await trio.sleep(180)
            assert len(gateway.tables) == handed + 1  # the same speeds: the same table, not handed again
            nursery.cancel_scope.cancel()
    finally:
        store.close()

"""With gateway worker processes, the control plane's batch runner sends its lines through a gateway of its own that
serves no port (`llmgw.control.batching.run_batches`): fed the plane's routing table, it counts the workers' requests
in flight (`GatewayWorkers.outstanding`) as the replica's load, so a batch waits while the workers fill the replica's
slots and runs once they are free; it works only while the plane leads. Stand-ins for the plane and the workers,
the llama-server stand-in as the engine, a real SQLite store. Time: about 3 s (the runner reads the store every second).
And what the engines say they queue, per replica, from the fleet's fresh readings."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import trio

from llmgw.control.batching import run_batches
from llmgw.control.feeding import GatewayFeed
from llmgw.control.registry import FleetRegistry
from llmgw.gateway.batch_lines import batch_object, read_lines
from llmgw.routes import ReplicaSpeed
from llmgw.store import BatchRecord, open_store

from tests.gateway.gateway_harness import make_table, replica, start_engine


async def test_a_batch_beside_workers_waits_for_their_load_and_for_leadership(tmp_path, nursery):
    _engine, url = await start_engine(nursery, alias="tiny")
    store = open_store(tmp_path / "store.db")
    feed = GatewayFeed(lambda replica_id: "", lambda name: None)
    feed.table = make_table({"tiny": [replica("r-0", url, speed=ReplicaSpeed(100.0, 100.0, slots=2))]})
    plane = SimpleNamespace(store=store, feed=feed, state_dir=tmp_path / "state", holder="cp-1", leader=False,
                            loop=SimpleNamespace(state=SimpleNamespace(fleet=FleetRegistry(30.0))))
    workers = SimpleNamespace(load={"r-0": 2})
    workers.outstanding = lambda: workers.load
    nursery.start_soon(run_batches, plane, None, workers)
    text = "\n".join(json.dumps({"custom_id": f"w-{i}", "method": "POST", "url": "/v1/completions",
                                 "body": {"model": "tiny", "prompt": "hi", "max_tokens": 2}}) for i in range(3))
    now = time.time()
    store.create_batch(BatchRecord("batch_w", "chat", "key_1", "in_progress", now, now + 3600, {
        "endpoint": "/v1/completions", "input_file_id": "file-w", "expires_at": now + 3600}),
        read_lines(text.encode(), "/v1/completions"))

    def counts():
        return batch_object(store.batch("batch_w"))["request_counts"]

    await trio.sleep(1.5)
    assert counts()["completed"] == 0  # not the leader
    plane.leader = True
    await trio.sleep(1.5)
    assert counts()["completed"] == 0  # the workers fill both slots
    workers.load = {}
    with trio.fail_after(10):
        while store.batch("batch_w").status != "completed":
            await trio.sleep(0.05)
    assert counts() == {"total": 3, "completed": 3, "failed": 0}
    assert {r.batch_id for r in store.recent_usage()} == {"batch_w"}
    store.close()


def test_the_engines_queues_come_from_fresh_readings_per_replica():
    from llmgw.control.batching import engine_waiting
    from llmgw.control.readings import NodeReadings, ShardReading
    from llmgw.identity import ShardState
    from llmgw.plan.types import NodeState, ObservedShard
    from llmgw.tools.engine_metrics import EngineLoad

    shards = (ObservedShard("a/0", "a", "tiny", ShardState.READY), ObservedShard("b/0", "b", "tiny",
                                                                                  ShardState.READY))
    fleet, _ = FleetRegistry(30.0).register(NodeState("n1", shards=shards), now=0.0)
    readings = NodeReadings(at=10.0, shards=(ShardReading("a/0", engine=EngineLoad(requests_waiting=3.0)),
                                             ShardReading("b/0", engine=EngineLoad(requests_waiting=0.0))))
    fleet, _ = fleet.heartbeat("n1", 10.0, readings=readings)
    assert engine_waiting(fleet, 11.0) == {"a": 3}
    assert engine_waiting(fleet, 10.0 + 3600) == {}  # stale readings say nothing

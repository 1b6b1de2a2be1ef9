"""The pieces of gateway worker processes that are pure or timer-driven: the feed's messages (the routing table and
KV blocks round-trip exactly, only changed replicas travel), rendezvous prefix affinity (the same replica from any
worker, moving only when loaded), the other workers' load in the balancer, and the restart backoff (on MockClock)."""

from __future__ import annotations

import itertools
import random
import socket
from dataclasses import replace
from types import MappingProxyType

import pytest
import trio
import trio.testing

from llmgw.gateway import Balancer
from llmgw.gateway.feed import (
    FeedError, MessageStream, apply_blocks_message, blocks_message, table_from_json, table_to_json,
)
from llmgw.gateway.restarts import MAX_DELAY, WorkerStartError, keep_running, restart_delay
from llmgw.gateway.routing import rendezvous_order
from llmgw.identity import Quota, Routing
from llmgw.routes import BlockSnapshot, ModelRoute, ProjectPolicy, ReplicaBlocks, ReplicaRoute, ReplicaSpeed, RouteTable

REPLICAS = tuple(ReplicaRoute(replica_id=f"r{i}", node_id="n", base_url=f"http://10.0.0.{i}:80", replica_key=f"k{i}")
                 for i in range(5))


def test_a_routing_table_round_trips_exactly_through_the_feed():
    """Every field, the engine and rerank too: a gateway worker passes Responses and Messages natively, and serves
    rerank, by them."""
    table = RouteTable(
        models=MappingProxyType({"gemma": ModelRoute(
            name="gemma", aliases=("g",), replicas=(REPLICAS[0], replace(REPLICAS[1], speed=ReplicaSpeed(
                2000.0, 150.5, slots=4, measured_at=1796400000.5, source="bench")), ReplicaRoute(
                replica_id="ext", node_id="", base_url="https://api.example.com", replica_key="sk", external=True,
                upstream_model="gpt-x")), prompt_price_per_million=0.5, completion_price_per_million=None,
            created=17, routing=Routing.ROUND_ROBIN, context_size=512, engine="vllm", rerank=True, wakes=True), "gemma-pirate": ModelRoute(  # a LoRA adapter on gemma's replicas, chosen by llama.cpp's lora
            name="gemma-pirate", replicas=REPLICAS[:2], adapter_of="gemma",
            body_fields=MappingProxyType({"lora": [{"id": 0, "scale": 1.0}]}))}),
        projects=MappingProxyType({"chat": ProjectPolicy(
            name="chat", team="t", organisation="o", models=frozenset({"gemma"}),
            quotas=(("project:chat", Quota(requests_per_minute=5, budget=2.5)), ("org:o", Quota(tokens_per_day=9))))}),
        stopped=True, settings_commit="ab" * 20, max_request_body_bytes=1234, currency="EUR")
    assert table_from_json(table_to_json(table)) == table
    assert table_from_json(table_to_json(RouteTable())) == RouteTable()
    with pytest.raises(FeedError):
        table_from_json({"models": {}})


def test_kv_blocks_travel_as_changes_and_arrive_whole():
    one = ReplicaBlocks(blocks=frozenset({1, 2**64 - 1}), block_size=128, hash_algorithm="sha256_cbor",
                        hash_seed="0", node_id="n1")
    two = ReplicaBlocks(blocks=frozenset({3}), block_size=128, hash_algorithm="sha256_cbor", hash_seed="0",
                        node_id="n2")
    first = BlockSnapshot(MappingProxyType({"a": one, "b": two}), version=1)
    message = blocks_message(first, None)
    assert message["full"] and set(message["replicas"]) == {"a", "b"}
    mirror = apply_blocks_message(BlockSnapshot(), message)
    assert mirror == first
    changed = replace_b = ReplicaBlocks(blocks=frozenset({3, 4}), block_size=128, hash_algorithm="sha256_cbor",
                                        hash_seed="0", node_id="n2")
    second = BlockSnapshot(MappingProxyType({"a": one, "b": replace_b}), version=2)
    delta = blocks_message(second, first)
    assert not delta["full"] and list(delta["replicas"]) == ["b"]  # "a" is the same object: it does not travel
    mirror = apply_blocks_message(mirror, delta)
    assert mirror.replicas["b"] == changed and mirror.version == 2
    third = BlockSnapshot(MappingProxyType({"b": replace_b}), version=3)
    gone = blocks_message(third, second)
    assert gone["replicas"] == {"a": None}
    assert apply_blocks_message(mirror, gone) == third
    assert blocks_message(third, third) is None


async def test_messages_cross_a_socketpair_whole_and_the_end_is_none():
    left, right = (trio.SocketStream(trio.socket.from_stdlib_socket(s)) for s in socket.socketpair())
    sender, receiver = MessageStream(left), MessageStream(right)
    big = {"type": "table", "table": table_to_json(RouteTable()), "pad": "x" * 3_000_000}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender.send, big)
        assert await receiver.receive() == big
    await sender.send({"type": "load", "outstanding": {"r1": 2}})
    await sender.aclose()
    assert await receiver.receive() == {"type": "load", "outstanding": {"r1": 2}}
    assert await receiver.receive() is None


async def test_a_feed_reset_by_a_killed_peer_ends_like_a_closed_one():
    """A process killed with unread messages in its socket resets the pair (ECONNRESET): that is the feed's end,
    not an error that would stop the control plane (a PostgreSQL run of test_gateway_workers.py met it)."""
    mine, theirs = socket.socketpair()
    feed = MessageStream(trio.SocketStream(trio.socket.from_stdlib_socket(mine)))
    await feed.send({"type": "table", "table": table_to_json(RouteTable())})  # never read by the peer
    theirs.close()
    assert await feed.receive() is None


def test_rendezvous_affinity_is_the_same_in_every_worker_and_moves_only_when_loaded():
    prefixes = [f"prefix-{i}" for i in range(200)]
    workers = [Balancer(rendezvous=True) for _ in range(3)]
    for prefix in prefixes:
        chosen = {w.choose(REPLICAS, prefix, 0.0).replica_id for w in workers}
        assert len(chosen) == 1  # the same replica from any worker, with no shared memory
        for w in workers:
            w.outstanding.clear()
    spread = {rendezvous_order(p, [r.replica_id for r in REPLICAS])[0] for p in prefixes}
    assert spread == {r.replica_id for r in REPLICAS}  # prefixes spread over every replica
    # a replica leaving moves only the prefixes it won
    before = {p: rendezvous_order(p, [r.replica_id for r in REPLICAS])[0] for p in prefixes}
    after = {p: rendezvous_order(p, [r.replica_id for r in REPLICAS[1:]])[0] for p in prefixes}
    assert all(before[p] == after[p] for p in prefixes if before[p] != "r0")
    # the bound: a prefix's replica loaded 8 above the least loaded (counting other workers) gives way to the next
    prefix = prefixes[0]
    home = before[prefix]
    balancer = Balancer(rendezvous=True)
    balancer.set_elsewhere({home: 8})
    second = rendezvous_order(prefix, [r.replica_id for r in REPLICAS])[1]
    assert balancer.choose(REPLICAS, prefix, 0.0).replica_id == second
    balancer.set_elsewhere({})
    balancer.finished(second)
    assert balancer.choose(REPLICAS, prefix, 0.0).replica_id == home


def test_least_loaded_counts_the_other_workers_requests():
    balancer = Balancer()
    balancer.set_elsewhere({"r0": 3, "r1": 1, "r2": 2, "r3": 4, "r4": 5})
    balancer.started("r1")
    balancer.started("r1")
    assert balancer.load()["r1"] == 3
    assert balancer.choose(REPLICAS, None, 0.0).replica_id == "r2"  # r1 has 1 elsewhere and 2 here
    assert Balancer().load() == {}


@pytest.mark.parametrize(("previous", "uptime", "expected"), [
    (None, 0.0, 1.0), (1.0, 0.5, 2.0), (2.0, 3.0, 4.0), (16.0, 1.0, MAX_DELAY), (MAX_DELAY, 1.0, MAX_DELAY),
    (MAX_DELAY, 60.0, 1.0), (8.0, 59.9, 16.0),
])
def test_restart_delay_doubles_to_30_s_and_starts_over_after_a_stable_run(previous, uptime, expected):
    assert restart_delay(previous, uptime) == expected


def test_a_worker_that_keeps_dying_is_restarted_with_backoff_on_the_clock():
    starts: list[float] = []
    lifetimes = itertools.chain([0.5] * 8, [100.0], itertools.repeat(0.5))

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        starts.append(trio.current_time())
        task_status.started()
        await trio.sleep(next(lifetimes))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(keep_running, run, "worker 0")
            await trio.sleep(400)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    gaps = [round(b - a - 0.5, 3) for a, b in zip(starts, starts[1:])]
    # died after 0.5 s each time: waits 1, 2, 4, 8, 16, 30, 30, 30; then a 100 s run: back to 1 s
    assert gaps[:8] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert round(starts[9] - starts[8] - 100.0, 3) == 1.0


def test_a_worker_that_never_serves_at_its_first_start_is_an_error():
    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        await trio.sleep(1)

    async def main() -> None:
        await keep_running(run, "worker 3")

    with pytest.raises(WorkerStartError, match="worker 3"):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_seeded_random_loads_never_route_a_prefix_to_a_replica_over_the_bound():
    rng = random.Random(7)
    for _ in range(60):
        load = {r.replica_id: rng.randrange(0, 12) for r in REPLICAS}
        balancer = Balancer(rendezvous=True)
        balancer.set_elsewhere(load)
        chosen = balancer.choose(REPLICAS, f"p{rng.random()}", 0.0)
        least = min(load.values())
        got = load[chosen.replica_id]
        assert got == least or (got < 8 and got - least < 8)

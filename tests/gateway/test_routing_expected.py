"""Routing by expected completion time as a pure function on seeded replica states.

Rules checked on 60 seeded fleets (speeds from CPU-slow to GPU-fast, some unmeasured, slots known or not, loads,
ejections, tried replicas, request sizes, prefix hits):
- it never chooses a replica it knows is full (slots reached) while an eligible one has room;
- it never chooses an excluded replica, nor an ejected one while another is not ejected;
- its choice has the smallest expected time of the replicas with room (nothing better was passed over);
- filling an empty fleet request by request, shares follow speed: no replica holds more than one request beyond
  its speed's share (load_i / D_i <= (load_j + 1) / D_j for every pair, requests of one size, no prefix hits).
"""

from __future__ import annotations

import random

import pytest

from llmgw.gateway.routing import EXPECTED_TIME, LEAST_LOADED, PromptBlocks, RoutingFacts
from llmgw.gateway.routing_expected import (
    AFFINITY_CACHED_TOKENS, cached_tokens, choose_by_expected_time, expected_seconds, has_room,
)
from dataclasses import replace

from llmgw.routes import ReplicaRoute, ReplicaSpeed


def _replicas(n: int) -> tuple[ReplicaRoute, ...]:
    return tuple(ReplicaRoute(replica_id=f"r{i}", node_id=f"n{i}", base_url=f"http://r{i}") for i in range(n))


def _with(replicas, speeds) -> tuple[ReplicaRoute, ...]:
    """`replicas` each with its speed of `speeds` (replica id -> ReplicaSpeed; missing: not measured)."""
    return tuple(replace(r, speed=speeds.get(r.replica_id)) for r in replicas)


def _choose(replicas, load, speeds, facts):
    """`choose_by_expected_time` over `replicas` with `speeds`; the choice names the replica as given (no speed)."""
    choice = choose_by_expected_time(_with(replicas, speeds), load, facts)
    by_id = {r.replica_id: r for r in replicas}
    return replace(choice, replica=by_id[choice.replica.replica_id] if choice.replica else None)


GPU = ReplicaSpeed(prefill_tokens_per_second=20000.0, decode_tokens_per_second=2000.0, slots=8)
CPU = ReplicaSpeed(prefill_tokens_per_second=200.0, decode_tokens_per_second=20.0, slots=2)


def _fleet(rng: random.Random):
    replicas = _replicas(rng.randint(1, 6))
    speeds = {}
    for replica in replicas:
        if rng.random() < 0.8:  # some are not measured yet
            decode = 10 ** rng.uniform(1, 3.5)
            speeds[replica.replica_id] = ReplicaSpeed(decode * rng.uniform(3, 20), decode,
                                                      slots=rng.choice([0, 1, 2, 4, 8]))
    load = {r.replica_id: rng.randint(0, 10) for r in replicas if rng.random() < 0.8}
    exclude = frozenset(r.replica_id for r in replicas if rng.random() < 0.15)
    ejected = {r.replica_id: 50.0 for r in replicas if rng.random() < 0.15}
    blocks = None
    if rng.random() < 0.5:
        prompt_blocks = tuple(range(rng.randint(1, 8)))
        blocks = PromptBlocks(prompt_blocks, {r.replica_id: frozenset(prompt_blocks[:rng.randint(0, 8)])
                                              for r in replicas if rng.random() < 0.7})
    facts = RoutingFacts(exclude=exclude, ejected=ejected, now=10.0, rotation=rng.randint(0, 9),
                         prompt_tokens=rng.choice([0, 16, 512, 4000]), output_tokens=rng.choice([0, 8, 256, 2000]),
                         blocks=blocks, prefix="p" if rng.random() < 0.5 else None,
                         affinity=rng.choice([None, *(r.replica_id for r in replicas)]))
    return replicas, speeds, load, facts


@pytest.mark.parametrize("seed", range(60))
def test_never_full_while_another_has_room_never_excluded_and_nothing_better_passed_over(seed):
    rng = random.Random(seed)
    replicas, speeds, load, facts = _fleet(rng)
    choice = _choose(replicas, load, speeds, facts)
    candidates = [r for r in replicas if r.replica_id not in facts.exclude]
    if not candidates:
        assert choice.replica is None
        return
    chosen = choice.replica
    assert chosen is not None and chosen.replica_id not in facts.exclude
    if any(r.replica_id not in facts.ejected for r in candidates):
        assert chosen.replica_id not in facts.ejected
        candidates = [r for r in candidates if r.replica_id not in facts.ejected]
    in_flight = {r.replica_id: load.get(r.replica_id, 0) for r in candidates}
    with_room = [r for r in candidates if has_room(speeds.get(r.replica_id), in_flight[r.replica_id])]
    if with_room:
        assert chosen in with_room, "chose a full replica while another had room"
    if not any(r.replica_id in speeds for r in candidates):
        assert choice.kind == LEAST_LOADED
        assert in_flight[chosen.replica_id] == min(in_flight.values())
        return
    assert choice.kind == EXPECTED_TIME
    measured = sorted(speeds[r.replica_id].decode_tokens_per_second for r in candidates if r.replica_id in speeds)
    prompt, output = facts.prompt_tokens or 256, facts.output_tokens or 256

    def seconds(replica):
        speed = speeds.get(replica.replica_id)
        if speed is None:  # the median of the measured ones
            pre = sorted(speeds[r.replica_id].prefill_tokens_per_second for r in candidates if r.replica_id in speeds)
            speed = ReplicaSpeed(_median(pre), _median(measured))
        return expected_seconds(speed, in_flight[replica.replica_id], prompt,
                                cached_tokens(replica, facts, prompt), output)

    assert seconds(chosen) <= min(seconds(r) for r in (with_room or candidates)) + 1e-9


def _median(values):
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


@pytest.mark.parametrize("seed", range(60))
def test_filling_a_fleet_request_by_request_gives_each_replica_its_speeds_share(seed):
    rng = random.Random(seed)
    replicas = _replicas(rng.randint(2, 5))
    speeds = {r.replica_id: ReplicaSpeed(10 ** rng.uniform(2, 5), 10 ** rng.uniform(1, 3.5)) for r in replicas}
    load: dict[str, int] = {}
    facts = RoutingFacts(prompt_tokens=rng.choice([64, 512]), output_tokens=rng.choice([32, 256]))
    for _ in range(rng.randint(1, 300)):
        chosen = _choose(replicas, load, speeds, facts).replica
        load[chosen.replica_id] = load.get(chosen.replica_id, 0) + 1

    def cost(replica_id):  # seconds one request takes alone there
        speed = speeds[replica_id]
        return facts.prompt_tokens / speed.prefill_tokens_per_second + facts.output_tokens / speed.decode_tokens_per_second

    for i in speeds:
        for j in speeds:
            assert load.get(i, 0) * cost(i) <= (load.get(j, 0) + 1) * cost(j) + 1e-9


def test_a_cpu_replica_takes_load_only_when_the_gpu_is_full_and_short_requests_first():
    gpu, cpu = _replicas(2)
    speeds = {gpu.replica_id: GPU, cpu.replica_id: CPU}
    facts = RoutingFacts(prompt_tokens=200, output_tokens=100)
    assert _choose((gpu, cpu), {"r0": 7}, speeds, facts).replica == gpu  # 7 of 8 slots: still first
    assert _choose((gpu, cpu), {"r0": 8}, speeds, facts).replica == cpu  # full: the CPU has room
    assert _choose((gpu, cpu), {"r0": 8, "r1": 2}, speeds, facts).replica == gpu  # both full
    # without slots known: a short request goes to the idle CPU once the GPU's queue outweighs it, a long one never
    open_gpu = {gpu.replica_id: ReplicaSpeed(20000.0, 2000.0), cpu.replica_id: CPU}
    short = RoutingFacts(prompt_tokens=20, output_tokens=4)
    long = RoutingFacts(prompt_tokens=2000, output_tokens=1000)
    assert _choose((gpu, cpu), {"r0": 120}, open_gpu, short).replica == cpu
    assert _choose((gpu, cpu), {"r0": 60}, open_gpu, long).replica == gpu


def test_prefix_hits_count_for_the_replica_holding_them():
    a, b = _replicas(2)
    same = ReplicaSpeed(1000.0, 100.0)
    speeds = {a.replica_id: same, b.replica_id: same}
    blocks = PromptBlocks((1, 2, 3, 4), {"r1": frozenset({1, 2, 3})})
    facts = RoutingFacts(prompt_tokens=4000, output_tokens=10, blocks=blocks)
    assert cached_tokens(b, facts, 4000) == 3000 and cached_tokens(a, facts, 4000) == 0
    assert _choose((a, b), {}, speeds, facts).replica == b
    # 4 s of prefill saved by b is worth less than a request already in flight there (4 + 0.1 s)
    assert _choose((a, b), {"r1": 1}, speeds, facts).replica == a
    affinity = RoutingFacts(prompt_tokens=4000, output_tokens=10, prefix="p", affinity="r0")
    assert cached_tokens(a, affinity, 4000) == AFFINITY_CACHED_TOKENS
    assert _choose((a, b), {}, speeds, affinity).replica == a


def test_unmeasured_replicas_count_as_the_median_and_none_measured_is_least_loaded():
    a, b, c = _replicas(3)
    speeds = {"r0": ReplicaSpeed(100.0, 10.0), "r1": ReplicaSpeed(10000.0, 1000.0)}
    facts = RoutingFacts(prompt_tokens=100, output_tokens=100)
    # the median of 10 and 1000 tokens/s is 505: c (unmeasured, idle) beats a (10 tokens/s) but not b
    assert _choose((a, b, c), {"r1": 0}, speeds, facts).replica == b
    assert _choose((a, b, c), {"r1": 1}, speeds, facts).replica == c
    choice = _choose((a, b, c), {"r0": 1, "r2": 1}, {}, RoutingFacts())
    assert (choice.replica, choice.kind) == (b, LEAST_LOADED)

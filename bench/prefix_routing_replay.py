"""Prefix-cache hits of routing policies on a simulated fleet (issue 13): round robin, least loaded, approximate
prefix affinity (the gateway's 256-character key), precise (KV blocks mirrored from events, `choose_by_blocks`), and
an oracle that sees every engine's cache as it is at the moment of the decision.

This is a SIMULATION, not the issue's benchmark with real engines: each replica is an LRU cache of `--capacity`
blocks standing in for vLLM's prefix cache; hits are counted by those caches (blocks of the prompt found, from the
first on), not by the policy. The precise policy sees the caches through events delayed by `--event-lag` requests,
as a real mirror lags its engine. Workload: `--system-prompts` long system prompts (8 blocks each) shared by many
conversations of several turns; each turn's prompt is the whole conversation so far. `--in-flight` requests are
outstanding at a time (they finish in order), so saturation matters.

Run: `.venv/bin/python bench/prefix_routing_replay.py` (a few seconds).
"""

from __future__ import annotations

import argparse
import random
from collections import OrderedDict, deque

from llmgw.gateway.routing import RoutingFacts, choose_replica
from llmgw.gateway.routing_prefix import choose_by_blocks
from llmgw.routes import ReplicaRoute


class Engine:
    """An LRU prefix cache of block ids; `serve` counts the prompt's leading blocks found, then stores them all."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def serve(self, prompt: list[int]) -> int:
        hits = 0
        for block in prompt:
            if block not in self.blocks:
                break
            hits += 1
        for block in prompt:
            self.blocks[block] = None
            self.blocks.move_to_end(block)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)
        return hits


def workload(seed: int, system_prompts: int, conversations: int, turns: int) -> list[tuple[int, list[int]]]:
    """(system prompt id, prompt block ids) per request, conversations interleaved at random."""
    rng = random.Random(seed)
    next_id = iter(range(1, 10**9))
    systems = [[next(next_id) for _ in range(8)] for _ in range(system_prompts)]
    live = []
    for _ in range(conversations):
        system = rng.randrange(system_prompts)
        live.append([system, list(systems[system]), turns])
    out = []
    while live:
        conversation = live[rng.randrange(len(live))]
        conversation[1] += [next(next_id) for _ in range(rng.randint(1, 3))]  # the user's turn
        out.append((conversation[0], list(conversation[1])))
        conversation[1] += [next(next_id) for _ in range(rng.randint(1, 2))]  # the answer
        conversation[2] -= 1
        if conversation[2] == 0:
            live.remove(conversation)
    return out


def run(policy: str, requests, replicas: int, capacity: int, in_flight: int, lag: int) -> tuple[float, dict]:
    routes = [ReplicaRoute(replica_id=f"r{i}", node_id=f"n{i}", base_url="") for i in range(replicas)]
    engines = {r.replica_id: Engine(capacity) for r in routes}
    outstanding: dict[str, int] = {}
    flying: deque[str] = deque()
    affinity: dict[int, str] = {}
    snapshots: deque[dict[str, frozenset[int]]] = deque()
    hits = total = 0
    kinds: dict[str, int] = {}
    for n, (system, prompt) in enumerate(requests):
        if len(flying) >= in_flight:
            done = flying.popleft()
            outstanding[done] -= 1
        snapshots.append({rid: frozenset(e.blocks) for rid, e in engines.items()} if policy == "precise" else {})
        if policy == "round-robin":
            chosen = routes[n % replicas]
        elif policy == "least-loaded":
            chosen = choose_replica(routes, outstanding, RoutingFacts(rotation=n))
        elif policy == "approximate":
            chosen = choose_replica(routes, outstanding, RoutingFacts(affinity=affinity.get(system), rotation=n))
            affinity[system] = chosen.replica_id
        elif policy == "precise":
            held = snapshots[0] if len(snapshots) > lag else {r.replica_id: frozenset() for r in routes}
            choice = choose_by_blocks(routes, outstanding, held, prompt, RoutingFacts(rotation=n))
            kinds[choice.kind] = kinds.get(choice.kind, 0) + 1
            chosen = choice.replica
        else:  # oracle: the caches as they are now
            now = {rid: frozenset(e.blocks) for rid, e in engines.items()}
            chosen = choose_by_blocks(routes, outstanding, now, prompt, RoutingFacts(rotation=n)).replica
        while len(snapshots) > lag:
            snapshots.popleft()
        hits += engines[chosen.replica_id].serve(prompt)
        total += len(prompt)
        outstanding[chosen.replica_id] = outstanding.get(chosen.replica_id, 0) + 1
        flying.append(chosen.replica_id)
    return hits / total, kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--capacity", type=int, default=400, help="blocks per engine's cache")
    parser.add_argument("--system-prompts", type=int, default=12)
    parser.add_argument("--conversations", type=int, default=300)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--event-lag", type=int, default=2, help="requests by which the precise mirror lags")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    requests = workload(args.seed, args.system_prompts, args.conversations, args.turns)
    print(f"{len(requests)} requests, {args.replicas} replicas, cache {args.capacity} blocks each, "
          f"{args.in_flight} in flight, event lag {args.event_lag} (simulated engines)")
    results = {p: run(p, requests, args.replicas, args.capacity, args.in_flight, args.event_lag)
               for p in ("round-robin", "least-loaded", "approximate", "precise", "oracle")}
    oracle = results["oracle"][0]
    print(f"{'policy':<14} {'block hit ratio':>16} {'of oracle':>10}")
    for policy, (ratio, kinds) in results.items():
        extra = f"  decisions: {kinds}" if kinds else ""
        print(f"{policy:<14} {ratio:>16.3f} {ratio / oracle:>9.1%}{extra}")


if __name__ == "__main__":
    main()

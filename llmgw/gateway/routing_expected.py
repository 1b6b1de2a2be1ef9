"""Routing by expected completion time (catalog `routing: expected-time`): the replica expected to finish the
request first, from its requests in flight, its measured speed and the prompt's prefix hits (pure).

Each replica with a measured `ReplicaRoute.speed` (prefill P and decode D tokens/s of the whole replica) is taken for a
processor that shares its speed among its requests. A request of p prompt tokens (c of them held in the replica's
prompt cache) and o output tokens, sent to a replica with n requests in flight, is expected to finish in

    n * (p / P + o / D)  +  (p - c) / P + o / D        seconds

(the gateway does not know the sizes of the requests in flight: each is taken for one like this). Choosing the
smallest gives a replica load in proportion to its speed: a replica 50 times slower takes one request for every
50 the fast one holds, and short requests (small p and o) cost it least, so it takes them first when the fast ones
fill up.

- Full: a replica with `slots` > 0 and as many requests in flight is full; while any eligible replica has room,
  full ones are left out (a request there would only queue).
- Unknown speed: a replica without a measurement is taken for the median of the measured ones (a new replica
  gets load, and with it, later, a measurement). When none is measured the choice is least loaded's.
- Prefix hits c: with precise prefix routing's blocks (`RoutingFacts.blocks`), the share of the prompt's full blocks
  the replica holds from the first on; else, on the replica `facts.affinity` names, the prefix key's
  `AFFINITY_CACHED_TOKENS` (its 256 characters at about 4 characters a token); else 0.
- Unknown request size: `facts.prompt_tokens` / `facts.output_tokens` of 0 count as `DEFAULT_PROMPT_TOKENS` /
  `DEFAULT_OUTPUT_TOKENS`.
- Ties (equal expected times within 1e-9 s) go by `facts.rotation`, as least loaded's do.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from llmgw.gateway.routing import (
    EXPECTED_TIME, LEAST_LOADED, PREFIX_CHARS, RoutingChoice, RoutingFacts, eligible, pick_from,
)
from llmgw.gateway.routing_prefix import leading_blocks_held
from llmgw.routes import ReplicaRoute, ReplicaSpeed

AFFINITY_CACHED_TOKENS = PREFIX_CHARS // 4
DEFAULT_PROMPT_TOKENS = 256
DEFAULT_OUTPUT_TOKENS = 256


def expected_seconds(speed: ReplicaSpeed, in_flight: int, prompt_tokens: int, cached_tokens: int,
                     output_tokens: int) -> float:
    """Seconds a request of `prompt_tokens` (`cached_tokens` of them in the replica's prompt cache) and
    `output_tokens` is expected to take on a replica of `speed` with `in_flight` requests (the formula above)."""
    whole = prompt_tokens / speed.prefill_tokens_per_second + output_tokens / speed.decode_tokens_per_second
    own = (max(prompt_tokens - cached_tokens, 0) / speed.prefill_tokens_per_second
           + output_tokens / speed.decode_tokens_per_second)
    return in_flight * whole + own


def has_room(speed: ReplicaSpeed | None, in_flight: int) -> bool:
    """Whether a replica of `speed` with `in_flight` requests can start one more at once (unknown slots: yes)."""
    return speed is None or speed.slots <= 0 or in_flight < speed.slots


def cached_tokens(replica: ReplicaRoute, facts: RoutingFacts, prompt_tokens: int) -> int:
    """The prompt tokens `replica` is expected to hold in its prompt cache (see the module docstring)."""
    blocks = facts.blocks
    if blocks is not None and blocks.blocks:
        held = leading_blocks_held(blocks.blocks, blocks.held.get(replica.replica_id))
        if held:
            return prompt_tokens * held // len(blocks.blocks)
    if facts.prefix is not None and facts.affinity == replica.replica_id:
        return min(prompt_tokens, AFFINITY_CACHED_TOKENS)
    return 0


def _usable(speed: ReplicaSpeed | None) -> bool:
    return speed is not None and speed.prefill_tokens_per_second > 0 and speed.decode_tokens_per_second > 0


def choose_by_expected_time(replicas: Sequence[ReplicaRoute], load: Mapping[str, int],
                            facts: RoutingFacts) -> RoutingChoice:
    """The replica expected to finish the request first among the `eligible` ones of `replicas` (table order,
    each with its measured `speed` or None), under `load` (replica id -> requests in flight, missing = 0). Kind "expected-time"; "least-loaded" when no eligible replica is measured. Replica None
    only when `replicas` minus `facts.exclude` is empty. Pure; never raises."""
    pool = eligible(replicas, facts)
    if not pool:
        return RoutingChoice(None, LEAST_LOADED)
    measured = [r.speed for r in pool if r.speed is not None and _usable(r.speed)]
    if not measured:
        return RoutingChoice(pick_from(pool, load, None, facts), LEAST_LOADED)
    median = ReplicaSpeed(statistics.median(s.prefill_tokens_per_second for s in measured),
                          statistics.median(s.decode_tokens_per_second for s in measured))

    def speed_of(replica: ReplicaRoute) -> ReplicaSpeed:
        speed = replica.speed
        return speed if speed is not None and _usable(speed) else median

    def in_flight(replica: ReplicaRoute) -> int:
        return load.get(replica.replica_id, 0)

    open_ = [r for r in pool if has_room(r.speed, in_flight(r))] or pool
    prompt = facts.prompt_tokens or DEFAULT_PROMPT_TOKENS
    output = facts.output_tokens or DEFAULT_OUTPUT_TOKENS
    scored = [(expected_seconds(speed_of(r), in_flight(r), prompt, cached_tokens(r, facts, prompt), output), r)
              for r in open_]
    best = min(seconds for seconds, _ in scored)
    tied = [r for seconds, r in scored if seconds - best <= 1e-9]
    return RoutingChoice(tied[facts.rotation % len(tied)], EXPECTED_TIME)

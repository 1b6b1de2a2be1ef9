"""The routing policies: one class per way of choosing a model's replica, chosen by the route's catalog `routing`.

A policy is pure: `choose(replicas, load, facts)` reads the route's ready replicas (table order), the requests in
flight per replica id (`Balancer.load()`) and the choice's `RoutingFacts` (affinity, ejections, clock, replicas
already tried, saturation, rotation, the prompt's prefix key and blocks), and returns a `RoutingChoice` whose kind
labels the `routing_decisions` counter. The gateway does the I/O around it (`proxying.open_upstream`: the try, the
retry, the balancer's bookkeeping).

| catalog `routing` | policy            | decides by                                                         |
|-------------------|-------------------|--------------------------------------------------------------------|
| round-robin       | `RoundRobin`      | the balancer's rotation alone (load and prefixes ignored)           |
| least-loaded      | `LeastLoaded`     | fewest requests in flight, ties rotated                            |
| prefix            | `PreciseKv`       | leading KV blocks held (`choose_by_blocks`) when the request has   |
|                   |                   | them, else `PrefixAffinity`: the prompt prefix's replica until     |
|                   |                   | saturated, else least loaded                                       |
| expected-time     | `ExpectedTime`    | the soonest expected completion from load, measured speed and      |
|                   |                   | prefix hits (`routing_expected.choose_by_expected_time`)           |

`POLICIES` maps each `llmgw.identity.Routing` to its policy; `policy_of(route)` is that lookup (no if-chain).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import ClassVar, Protocol

from llmgw.gateway.routing import (
    APPROXIMATE, LEAST_LOADED, ROUND_ROBIN, RoutingChoice, RoutingFacts, eligible, pick_from,
)
from llmgw.gateway.routing_expected import choose_by_expected_time
from llmgw.gateway.routing_prefix import choose_by_blocks
from llmgw.identity import Routing
from llmgw.routes import ModelRoute, ReplicaRoute

_NO_LOAD: Mapping[str, int] = MappingProxyType({})


class RoutingPolicy(Protocol):
    """How a route chooses one of its replicas for one try of a request.

    `by_prefix`: the gateway works out the prompt's prefix key and blocks (`RoutingFacts.prefix`, `.blocks`) for
    this policy; False: they stay None (a policy that ignores the prompt costs no hashing or tokenising).
    """

    by_prefix: ClassVar[bool]

    def choose(self, replicas: Sequence[ReplicaRoute], load: Mapping[str, int],
               facts: RoutingFacts) -> RoutingChoice:
        """The replica for one try among `replicas` (table order) under `load` (replica id -> requests in flight,
        missing = 0) and `facts`; its `replica` is None only when `replicas` minus `facts.exclude` is empty.
        Pure; never raises."""
        ...


def _least_loaded(replicas: Sequence[ReplicaRoute], load: Mapping[str, int],
                  facts: RoutingFacts) -> ReplicaRoute | None:
    """The least loaded of the `eligible` replicas, ties rotated by `facts.rotation`, whatever `facts.affinity`
    says; None when none is eligible."""
    pool = eligible(replicas, facts)
    return pick_from(pool, load, None, facts) if pool else None


class RoundRobin:
    """Each replica in turn: every replica ties at load 0, so the rotation alone picks (ejected and tried replicas
    still left out). The baseline the others are measured against (bench/prefix_routing.py)."""

    by_prefix: ClassVar[bool] = False

    def choose(self, replicas: Sequence[ReplicaRoute], load: Mapping[str, int],
               facts: RoutingFacts) -> RoutingChoice:
        return RoutingChoice(_least_loaded(replicas, _NO_LOAD, facts), ROUND_ROBIN)


class LeastLoaded:
    """The fewest requests in flight (this gateway's and, for workers, the others'), ties rotated."""

    by_prefix: ClassVar[bool] = False

    def choose(self, replicas: Sequence[ReplicaRoute], load: Mapping[str, int],
               facts: RoutingFacts) -> RoutingChoice:
        return RoutingChoice(_least_loaded(replicas, load, facts), LEAST_LOADED)


class PrefixAffinity:
    """Approximate prefix routing: the replica `facts.affinity` names (that last served the prompt's prefix, or
    its rendezvous replica) until saturated, else least loaded. Its kind is "approximate" when the prompt has a
    prefix key, "least-loaded" when it has none (no prompt text)."""

    by_prefix: ClassVar[bool] = True

    def choose(self, replicas: Sequence[ReplicaRoute], load: Mapping[str, int],
               facts: RoutingFacts) -> RoutingChoice:
        pool = eligible(replicas, facts)
        replica = pick_from(pool, load, facts.affinity, facts) if pool else None
        return RoutingChoice(replica, APPROXIMATE if facts.prefix is not None else LEAST_LOADED)


class PreciseKv:
    """Precise prefix routing: the replica whose engine holds the longest run of the prompt's leading KV blocks
    (`routing_prefix.choose_by_blocks`, which itself falls back to the approximate policy or least loaded) when
    `facts.blocks` is known; else `PrefixAffinity`."""

    by_prefix: ClassVar[bool] = True
    approximate: ClassVar[PrefixAffinity] = PrefixAffinity()

    def choose(self, replicas: Sequence[ReplicaRoute], load: Mapping[str, int],
               facts: RoutingFacts) -> RoutingChoice:
        blocks = facts.blocks
        if blocks is None:
            return self.approximate.choose(replicas, load, facts)
        return choose_by_blocks(replicas, load, blocks.held, blocks.blocks, facts)


class ExpectedTime:
    """The replica expected to finish the request first (`routing_expected.choose_by_expected_time`: requests in
    flight, each replica's measured `speed`, the prompt's prefix hits from `facts.blocks` or `facts.affinity`); least loaded while no
    replica is measured."""

    by_prefix: ClassVar[bool] = True

    def choose(self, replicas: Sequence[ReplicaRoute], load: Mapping[str, int],
               facts: RoutingFacts) -> RoutingChoice:
        return choose_by_expected_time(replicas, load, facts)


POLICIES: Mapping[Routing, RoutingPolicy] = MappingProxyType({
    Routing.ROUND_ROBIN: RoundRobin(),
    Routing.LEAST_LOADED: LeastLoaded(),
    Routing.PREFIX: PreciseKv(),
    Routing.EXPECTED_TIME: ExpectedTime(),
})


def policy_of(route: ModelRoute) -> RoutingPolicy:
    """The policy of `route`'s catalog `routing`. Raises KeyError for a `Routing` member without a policy (a test
    checks that every member has one)."""
    return POLICIES[route.routing]

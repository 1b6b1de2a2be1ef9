"""Choosing a replica: least outstanding requests, prefix affinity ("sticky until saturated"), ejection.

The decision is a pure function, `choose_replica`, over plain data: the ready replicas, their outstanding request
counts, and the choice's `RoutingFacts` (the replica that last served this prompt prefix, the ejected set, the
replicas already tried, saturation, rotation). `Balancer` holds that data for the gateway (one trio thread, no
locks), builds each choice's facts (`Balancer.facts`) and records outcomes. The route's `RoutingPolicy`
(`routing_policies`) decides with these functions; every decision is a `RoutingChoice` with its kind.

- Least outstanding: among eligible replicas, the fewest requests in flight through this gateway; ties go to the
  first in table order, rotated by a counter so equal replicas share the load.
- Prefix affinity: a hash of the prompt's leading `PREFIX_CHARS` characters maps to the replica that served it last.
  That replica is chosen while its outstanding count is below `saturation` and not above the least loaded one's by
  `saturation` or more; else least outstanding decides (and the prefix moves to the new replica).
- Ejection: a replica that refused a connection or failed a health check is left out until `now + cooldown`; when
  every replica is ejected, the ejected ones are used anyway (better a try than a certain 503).

Gateway worker processes (`llmgw.gateway.worker`) cannot share the remembered affinity, so their balancers use
`rendezvous=True`: a prefix's replica is the first, in the prefix's rendezvous order (`rendezvous_order`: highest
random weight hashing of (prefix, replica id)), that is within the same load bound; every worker computes the same
order from the same table, so the same prefix goes to the same replica from any worker, and a replica joining or
leaving moves only the prefixes it wins or held. Their outstanding counts add the other workers' (`elsewhere`, fed by
the control plane), so "least loaded" means across all workers.

- Canary split: while a model's route carries a `canary_share`, its requests are counted and `canary_turn` says
  which go to the canary replicas (exactly floor(n x share) of the first n, evenly spread); `canary_pool` gives the
  side a request chooses in, by the policy as usual. A retry goes anywhere not tried yet.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from typing import Literal

from llmgw.routes import ModelRoute, ReplicaRoute

PREFIX_CHARS = 256
DEFAULT_SATURATION = 8
DEFAULT_COOLDOWN = 10.0
AFFINITY_ENTRIES = 65536


def prefix_key(model: str, body: Mapping) -> str | None:
    """A short hash of the model and the prompt's leading text (chat: messages in order; completions: prompt).

    None when the body carries no prompt text (e.g. embeddings of token ids).
    """
    text = ""
    messages = body.get("messages")
    if isinstance(messages, list):
        pieces = []
        for message in messages:
            if isinstance(message, Mapping):
                content = message.get("content")
                pieces.append(f"{message.get('role')}\x1f{content if isinstance(content, str) else content!r}\x1e")
            if sum(map(len, pieces)) >= PREFIX_CHARS:
                break
        text = "".join(pieces)
    else:
        prompt = body.get("prompt", body.get("input"))
        if isinstance(prompt, str):
            text = prompt
        elif isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            text = prompt[0]
    if not text:
        return None
    return hashlib.blake2b(f"{model}\x00{text[:PREFIX_CHARS]}".encode(), digest_size=8).hexdigest()


def rendezvous_order(prefix: str, replica_ids: Sequence[str]) -> list[str]:
    """`replica_ids` in the order of their weight for `prefix`, highest first (rendezvous hashing: blake2b of
    prefix and replica id; ties, which need a hash collision, by id). Pure; the same on every process."""
    def weight(replica_id: str) -> bytes:
        return hashlib.blake2b(f"{prefix}\x00{replica_id}".encode(), digest_size=8).digest()

    return sorted(replica_ids, key=lambda rid: (weight(rid), rid), reverse=True)


PRECISE = "precise"
APPROXIMATE = "approximate"
LEAST_LOADED = "least-loaded"
ROUND_ROBIN = "round-robin"
EXPECTED_TIME = "expected-time"
DecisionKind = Literal["precise", "approximate", "least-loaded", "round-robin", "expected-time"]


@dataclass(frozen=True, slots=True)
class RoutingChoice:
    """One routing decision: the chosen replica (None when there is none to choose), the decision's kind (the
    `routing_decisions` counter's label), and how many leading blocks of the prompt the chosen replica holds (0
    unless the kind is "precise")."""

    replica: ReplicaRoute | None
    kind: DecisionKind
    matched_blocks: int = 0


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """Precise routing's inputs for one request: the prompt's full-block hashes in order, and per replica id the
    blocks its engine holds (None: it sends no events). See `llmgw.gateway.routing_prefix`."""

    blocks: tuple[int, ...]
    held: Mapping[str, frozenset[int] | None]


@dataclass(frozen=True, slots=True)
class RoutingFacts:
    """What one replica choice knows besides the replicas and their load (`Balancer.facts` builds it per try).

    `affinity`: the replica id this prompt's prefix belongs to (remembered, or by rendezvous), None: no preference.
    `ejected`: replica id -> monotonic time (seconds) until which it is left out (None: none is). `now`: that
    clock's time, seconds. `exclude`: replica ids already tried for this request. `saturation`: requests in flight
    at which a replica loses a prefix's preference. `rotation`: breaks ties among equally loaded replicas.
    `prefix`: the prompt's prefix key (`prefix_key`; None: no prompt text, or a policy that ignores prefixes).
    `blocks`: the prompt's blocks and what each replica holds (None: precise routing is off for this request).
    `prompt_tokens`, `output_tokens`: the request's size as the gateway guesses it (its prompt estimate, the
    `max_tokens` asked; 0: unknown).
    """

    affinity: str | None = None
    ejected: Mapping[str, float] | None = None
    now: float = 0.0
    exclude: frozenset[str] = frozenset()
    saturation: int = DEFAULT_SATURATION
    rotation: int = 0
    prefix: str | None = None
    blocks: PromptBlocks | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0


NO_FACTS = RoutingFacts()


def eligible(replicas: Sequence[ReplicaRoute], facts: RoutingFacts) -> list[ReplicaRoute]:
    """The replicas a choice picks from: `replicas` minus `facts.exclude`, minus the ejected ones unless every one
    left is ejected (better a try than a certain 503); in table order; empty when all were excluded. Pure."""
    candidates = [r for r in replicas if r.replica_id not in facts.exclude]
    ejected = facts.ejected
    if not ejected:
        return candidates
    now = facts.now
    return [r for r in candidates if ejected.get(r.replica_id, 0.0) <= now] or candidates


def under_saturation(load: int, least: int, saturation: int) -> bool:
    """Whether a replica with `load` requests in flight keeps a prompt's preference (affinity, held blocks): below
    `saturation` and less than `saturation` above the least loaded eligible replica's `least`."""
    return load < saturation and load - least < saturation


def rendezvous_affinity(replicas: Sequence[ReplicaRoute], prefix: str, outstanding: Mapping[str, int],
                        facts: RoutingFacts = NO_FACTS) -> str | None:
    """The replica id `prefix` belongs to now: the first in its `rendezvous_order` among the `eligible` replicas
    whose load keeps the preference (`under_saturation` of `facts.saturation`); None when none does (least loaded
    decides). `outstanding`: replica id -> requests in flight (missing = 0). Reads `facts`' ejected, now, exclude
    and saturation only. Pure."""
    pool = eligible(replicas, facts)
    if not pool:
        return None
    least = min(outstanding.get(r.replica_id, 0) for r in pool)
    for replica_id in rendezvous_order(prefix, [r.replica_id for r in pool]):
        if under_saturation(outstanding.get(replica_id, 0), least, facts.saturation):
            return replica_id
    return None


def choose_replica(replicas: Sequence[ReplicaRoute], outstanding: Mapping[str, int],
                   facts: RoutingFacts = NO_FACTS) -> ReplicaRoute | None:
    """Pick the replica for one request, or None when `replicas` minus `facts.exclude` is empty.

    `outstanding`: replica id -> requests in flight (missing = 0). Among the `eligible` replicas: `facts.affinity`'s
    replica while it is `under_saturation`, else the least loaded, ties in table order rotated by `facts.rotation`.
    Reads `facts`' affinity, ejected, now, exclude, saturation and rotation (not prefix nor blocks). Pure.
    """
    pool = eligible(replicas, facts)
    if not pool:
        return None
    return pick_from(pool, outstanding, facts.affinity, facts)


def pick_from(pool: Sequence[ReplicaRoute], outstanding: Mapping[str, int], affinity: str | None,
              facts: RoutingFacts) -> ReplicaRoute:
    """`choose_replica`'s pick among a non-empty `eligible` `pool`, with `affinity` in place of `facts.affinity`
    (None: least loaded alone). Pure."""
    least = min(outstanding.get(r.replica_id, 0) for r in pool)
    if affinity is not None:
        for replica in pool:
            if replica.replica_id == affinity:
                if under_saturation(outstanding.get(affinity, 0), least, facts.saturation):
                    return replica
                break
    tied = [r for r in pool if outstanding.get(r.replica_id, 0) == least]
    return tied[facts.rotation % len(tied)]


def canary_turn(count: int, share: float) -> bool:
    """Whether a model's request number `count` (0-based) goes to its canary at `share` (0..1): of the first n
    requests exactly floor(n x share) do, spread evenly (share 0.25: the 4th, 8th, 12th ...). Pure."""
    return math.floor((count + 1) * share + 1e-9) > math.floor(count * share + 1e-9)


def canary_pool(replicas: Sequence[ReplicaRoute], share: float | None, turn: bool) -> Sequence[ReplicaRoute]:
    """The replicas one request chooses among: all of `replicas` when `share` is None (no canary); else the canary
    ones on the request's `turn` and the others when not; all when that side has none. Pure."""
    if share is None:
        return replicas
    side = [r for r in replicas if r.canary == turn]
    return side or replicas


class Balancer:
    """The gateway's routing state: outstanding counts, prefix affinity (bounded LRU), ejections.

    Not thread-safe; used from the gateway's trio thread only. Times are `trio.current_time()`-like seconds.
    `rendezvous`: prefixes go by `rendezvous_affinity` instead of the remembered affinity (gateway workers).
    `outstanding` counts this process's requests; `elsewhere` (set by `set_elsewhere`) the other workers'; `load()`
    is their sum, what the policies read.
    """

    def __init__(self, *, saturation: int = DEFAULT_SATURATION, cooldown: float = DEFAULT_COOLDOWN,
                 affinity_entries: int = AFFINITY_ENTRIES, rendezvous: bool = False):
        self.saturation = saturation
        self.cooldown = cooldown
        self.rendezvous = rendezvous
        self.outstanding: dict[str, int] = {}
        self.elsewhere: Mapping[str, int] = {}
        self.ejected: dict[str, float] = {}
        self._affinity: OrderedDict[str, str] = OrderedDict()
        self._affinity_entries = affinity_entries
        self._rotation = 0
        self._canary_counts: dict[str, int] = {}

    def canary_pool(self, route: ModelRoute) -> Sequence[ReplicaRoute]:
        """The replicas of `route` the next request chooses among (`canary_pool`), counting it when the route has a
        canary (a count per model name, for `canary_turn`)."""
        share = route.canary_share
        if share is None:
            return route.replicas
        count = self._canary_counts.get(route.name, 0)
        self._canary_counts[route.name] = count + 1
        return canary_pool(route.replicas, share, canary_turn(count, share))

    def choose(self, replicas: Sequence[ReplicaRoute], prefix: str | None, now: float,
               exclude: frozenset[str] = frozenset()) -> ReplicaRoute | None:
        """Choose by the prefix affinity policy (see `choose_replica`) and remember the choice for `prefix`."""
        replica = choose_replica(replicas, self.load(), self.facts(replicas, now, exclude, prefix))
        self.remember(prefix, replica)
        return replica

    def load(self) -> Mapping[str, int]:
        """Requests in flight per replica id: this process's plus the other workers' (`elsewhere`)."""
        if not self.elsewhere:
            return self.outstanding
        total = dict(self.elsewhere)
        for replica_id, count in self.outstanding.items():
            total[replica_id] = total.get(replica_id, 0) + count
        return total

    def set_elsewhere(self, outstanding: Mapping[str, int]) -> None:
        """The other gateway workers' requests in flight per replica id (the control plane's `load` message)."""
        self.elsewhere = dict(outstanding)

    def facts(self, replicas: Sequence[ReplicaRoute], now: float, exclude: frozenset[str] = frozenset(),
              prefix: str | None = None, blocks: PromptBlocks | None = None,
              size: tuple[int, int] = (0, 0)) -> RoutingFacts:
        """The `RoutingFacts` of one choice among `replicas` at `now` (seconds, this balancer's clock), leaving out
        `exclude`: this balancer's ejections, saturation and next rotation, the request's `size` (prompt tokens,
        output tokens; 0 unknown), and the affinity of `prefix` (remembered, or with `rendezvous` worked out over
        `replicas` and `load()`; None when `prefix` is None). Advances the rotation by one."""
        self._rotation += 1
        prompt_tokens, output_tokens = size
        facts = RoutingFacts(ejected=self.ejected, now=now, exclude=exclude, saturation=self.saturation,
                             rotation=self._rotation, prefix=prefix, blocks=blocks, prompt_tokens=prompt_tokens,
                             output_tokens=output_tokens)
        if prefix is None:
            return facts
        if self.rendezvous:
            affinity = rendezvous_affinity(replicas, prefix, self.load(), facts)
        else:
            affinity = self._affinity.get(prefix)
        return replace(facts, affinity=affinity) if affinity is not None else facts

    def remember(self, prefix: str | None, replica: ReplicaRoute | None) -> None:
        """Remember that `replica` served `prefix` (the approximate policy's affinity; bounded LRU; nothing with
        `rendezvous`, whose affinity is worked out each time)."""
        if replica is not None and prefix is not None and not self.rendezvous:
            self._affinity[prefix] = replica.replica_id
            self._affinity.move_to_end(prefix)
            if len(self._affinity) > self._affinity_entries:
                self._affinity.popitem(last=False)

    def started(self, replica_id: str) -> None:
        self.outstanding[replica_id] = self.outstanding.get(replica_id, 0) + 1

    def finished(self, replica_id: str) -> None:
        left = self.outstanding.get(replica_id, 0) - 1
        if left > 0:
            self.outstanding[replica_id] = left
        else:
            self.outstanding.pop(replica_id, None)

    def eject(self, replica_id: str, now: float) -> None:
        """Leave `replica_id` out until `now + cooldown` (connection refused, failed health check)."""
        self.ejected[replica_id] = now + self.cooldown

    def readmit(self, replica_id: str) -> None:
        """A health check passed: use the replica again at once."""
        self.ejected.pop(replica_id, None)

    def is_ejected(self, replica_id: str, now: float) -> bool:
        return self.ejected.get(replica_id, 0.0) > now

"""Choosing a replica: least outstanding requests, prefix affinity ("sticky until saturated"), ejection.

The decision is a pure function, `choose_replica`, over plain data (the ready replicas, their outstanding request
counts, the replica that last served this prompt prefix, the ejected set); `Balancer` holds that data for the
gateway (one trio thread, no locks) and records outcomes.

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
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from llmgw.routes import ReplicaRoute

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


def rendezvous_affinity(replicas: Sequence[ReplicaRoute], prefix: str, outstanding: Mapping[str, int], *,
                        ejected: Mapping[str, float] | None = None, now: float = 0.0,
                        exclude: frozenset[str] = frozenset(), saturation: int = DEFAULT_SATURATION) -> str | None:
    """The replica id `prefix` belongs to now: the first in its `rendezvous_order` among the eligible replicas (not
    excluded, not ejected unless all are) whose load is below `saturation` and less than `saturation` above the
    least loaded one's; None when none is (least loaded decides). Pure."""
    candidates = [r for r in replicas if r.replica_id not in exclude]
    ejected = ejected or {}
    pool = [r for r in candidates if ejected.get(r.replica_id, 0.0) <= now] or candidates
    if not pool:
        return None
    least = min(outstanding.get(r.replica_id, 0) for r in pool)
    for replica_id in rendezvous_order(prefix, [r.replica_id for r in pool]):
        load = outstanding.get(replica_id, 0)
        if load < saturation and load - least < saturation:
            return replica_id
    return None


def choose_replica(replicas: Sequence[ReplicaRoute], outstanding: Mapping[str, int], *,
                   affinity: str | None = None, ejected: Mapping[str, float] | None = None, now: float = 0.0,
                   exclude: frozenset[str] = frozenset(), saturation: int = DEFAULT_SATURATION,
                   rotation: int = 0) -> ReplicaRoute | None:
    """Pick the replica for one request, or None when `replicas` minus `exclude` is empty.

    `outstanding`: replica id -> requests in flight (missing = 0). `affinity`: the replica id that last served this
    prefix. `ejected`: replica id -> monotonic time (seconds) until which it is left out. `rotation` breaks ties.
    """
    candidates = [r for r in replicas if r.replica_id not in exclude]
    if not candidates:
        return None
    ejected = ejected or {}
    healthy = [r for r in candidates if ejected.get(r.replica_id, 0.0) <= now]
    pool = healthy or candidates
    least = min(outstanding.get(r.replica_id, 0) for r in pool)
    if affinity is not None:
        for replica in pool:
            if replica.replica_id == affinity:
                load = outstanding.get(affinity, 0)
                if load < saturation and load - least < saturation:
                    return replica
                break
    tied = [r for r in pool if outstanding.get(r.replica_id, 0) == least]
    return tied[rotation % len(tied)]


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

    def choose(self, replicas: Sequence[ReplicaRoute], prefix: str | None, now: float,
               exclude: frozenset[str] = frozenset()) -> ReplicaRoute | None:
        """Choose (see `choose_replica`) and remember the choice for `prefix`."""
        replica = choose_replica(replicas, self.load(), **self.policy_inputs(prefix, now, exclude, replicas))
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

    def policy_inputs(self, prefix: str | None, now: float, exclude: frozenset[str] = frozenset(),
                      replicas: Sequence[ReplicaRoute] = ()) -> dict:
        """The keyword arguments `choose_replica` (and `choose_by_blocks`) take from this balancer for one choice:
        the affinity of `prefix` (remembered, or with `rendezvous` worked out over `replicas`), ejections,
        saturation and the next rotation."""
        self._rotation += 1
        if prefix is None:
            affinity = None
        elif self.rendezvous:
            affinity = rendezvous_affinity(replicas, prefix, self.load(), ejected=self.ejected, now=now,
                                           exclude=exclude, saturation=self.saturation)
        else:
            affinity = self._affinity.get(prefix)
        return dict(affinity=affinity, ejected=self.ejected, now=now, exclude=exclude, saturation=self.saturation,
                    rotation=self._rotation)

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

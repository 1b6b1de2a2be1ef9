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
    """

    def __init__(self, *, saturation: int = DEFAULT_SATURATION, cooldown: float = DEFAULT_COOLDOWN,
                 affinity_entries: int = AFFINITY_ENTRIES):
        self.saturation = saturation
        self.cooldown = cooldown
        self.outstanding: dict[str, int] = {}
        self.ejected: dict[str, float] = {}
        self._affinity: OrderedDict[str, str] = OrderedDict()
        self._affinity_entries = affinity_entries
        self._rotation = 0

    def choose(self, replicas: Sequence[ReplicaRoute], prefix: str | None, now: float,
               exclude: frozenset[str] = frozenset()) -> ReplicaRoute | None:
        """Choose (see `choose_replica`) and remember the choice for `prefix`."""
        replica = choose_replica(replicas, self.outstanding, **self.policy_inputs(prefix, now, exclude))
        self.remember(prefix, replica)
        return replica

    def policy_inputs(self, prefix: str | None, now: float, exclude: frozenset[str] = frozenset()) -> dict:
        """The keyword arguments `choose_replica` (and `choose_by_blocks`) take from this balancer for one choice:
        the affinity of `prefix`, ejections, saturation and the next rotation."""
        self._rotation += 1
        return dict(affinity=self._affinity.get(prefix) if prefix is not None else None, ejected=self.ejected,
                    now=now, exclude=exclude, saturation=self.saturation, rotation=self._rotation)

    def remember(self, prefix: str | None, replica: ReplicaRoute | None) -> None:
        """Remember that `replica` served `prefix` (the approximate policy's affinity; bounded LRU)."""
        if replica is not None and prefix is not None:
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

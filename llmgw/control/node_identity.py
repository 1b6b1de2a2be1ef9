"""Which Register may speak for a node id: the node's secret, recorded on first use (issue 25, item 1).

Every agent sends its node secret in Register (`llmgw.agent.node_secret`: 32 random bytes, kept 0600 in its
state directory). The control plane keeps, per node id, only the secret's SHA-256 (a hash is enough for 256
random bits; no KDF is needed), in the store's key/value table under "node.identity.<node id>" as JSON
{"sha256": hex, "since": unix seconds, "by": "first use" | "certificate"}, so every control plane sharing the store
(docs/ha.md) and every restart of one knows it. Rules (`judge`, pure):

- a Register without a secret (an agent older than this rule) is refused on a plain-text link (loopback,
  `--insecure`); over mutual TLS its certificate, whose name must be the node id, proves it;
- the first Register of a node id with a secret records it: trust on first use. That is also how every node known
  before this rule gets its identity, at its first Register after the upgrade;
- later Registers must carry the same secret, whether or not the node is connected: another one is refused with a
  sentence the agent logs, and the node's session, if any, stays;
- over mutual TLS the certificate vouches for the secret the node sends, which is recorded when it differs (a node
  that joined again with a new state directory);
- `llmgw node forget-identity ID` empties the record ("" in the table): the next Register records a new secret.

`NodeIdentities.prove` runs `judge` against the store (in a worker thread) and records with `Store.swap`, so two
control planes, or two streams of one, never both record a first secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import trio

from llmgw.errors import StoreError, TemporaryError, WireError

log = logging.getLogger("llmgw.control")

KEY_PREFIX = "node.identity."
MIN_SECRET, MAX_SECRET = 32, 256
"""Lengths (characters) of a node secret the control plane accepts; the agent makes 43."""


def identity_key(node_id: str) -> str:
    """The store's key/value entry holding `node_id`'s identity."""
    return KEY_PREFIX + node_id


def secret_digest(secret: str) -> str:
    """The SHA-256 (hex) of a node secret, as the record keeps it."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Verdict:
    """What `judge` decided: `refusal` (a sentence for the agent) or None to accept, and `record` (the JSON to
    store in place of what was read) or None to leave the record as it is."""

    refusal: str | None
    record: str | None = None


def _forget_hint(node_id: str) -> str:
    return (f"If this is node {node_id!r} with a new state directory, let it in on the control plane with "
            f"`llmgw node forget-identity {node_id}`; otherwise another machine is using this node id.")


def judge(node_id: str, stored: str | None, secret: str, certified: bool, now: float) -> Verdict:
    """Whether a Register of `node_id` carrying `secret` may speak for it, given the record `stored` (the raw
    store value: None or "" none yet). `certified`: the link showed a client certificate naming `node_id`.
    `now`: unix seconds, for a new record. Pure."""
    if secret and not (MIN_SECRET <= len(secret) <= MAX_SECRET and secret.isascii() and secret.isprintable()):
        return Verdict(f"node {node_id!r} sent a node secret that is not one ({MIN_SECRET} to {MAX_SECRET} printable "
                       "characters); the agent makes it in its state directory (node-secret): move a damaged one away.")
    if not secret:
        if certified:
            return Verdict(None)
        return Verdict(f"node {node_id!r} sent no node secret, which a plain-text agents port requires of every "
                       "Register: upgrade llmgw on the node (its agent makes one in its state directory), or "
                       "connect it over mutual TLS (`llmgw node join`).")
    digest = secret_digest(secret)
    fresh = json.dumps({"sha256": digest, "since": round(now, 3),
                        "by": "certificate" if certified else "first use"}, sort_keys=True)
    if not stored:
        return Verdict(None, fresh)
    try:
        recorded = json.loads(stored)["sha256"]
        matches = isinstance(recorded, str) and hmac.compare_digest(recorded, digest)
    except (ValueError, TypeError, KeyError):
        matches = False  # a damaged record proves nothing and lets nobody in by default
    if matches:
        return Verdict(None)
    if certified:
        return Verdict(None, fresh)
    return Verdict(f"node {node_id!r} is already known with another node secret, so this Register is refused. "
                   + _forget_hint(node_id))


class MemoryKv:
    """The two store methods `NodeIdentities` uses (`get`, `swap`), in memory: for a hub without a store."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def swap(self, key: str, expected: str | None, value: str) -> bool:
        with self._lock:
            if self.values.get(key) != expected:
                return False
            self.values[key] = value
            return True


class NodeIdentities:
    """The node identities of one control plane, kept in `store` (a `llmgw.store.Store`, or MemoryKv)."""

    def __init__(self, store: Any = None) -> None:
        self.store = store if store is not None else MemoryKv()

    async def prove(self, node_id: str, secret: str, certified: bool) -> None:
        """Accept a Register of `node_id` carrying `secret` (recording it where `judge` says), or refuse it.

        Raises: WireError with the sentence for the agent, also when the store fails (the stream ends and the
        agent tries again)."""
        try:
            await trio.to_thread.run_sync(self._prove, node_id, secret, certified)
        except (StoreError, TemporaryError) as exc:
            raise WireError(f"the control plane cannot check the identity of node {node_id!r} now ({exc}); the agent "
                            "tries again.") from exc

    def _prove(self, node_id: str, secret: str, certified: bool) -> None:
        key = identity_key(node_id)
        for _attempt in range(3):
            stored = self.store.get(key)
            verdict = judge(node_id, stored, secret, certified, time.time())
            if verdict.refusal is not None:
                log.warning("refused a Register of node %s: %s", node_id, verdict.refusal)
                raise WireError(verdict.refusal)
            if verdict.record is None or self.store.swap(key, stored, verdict.record):
                if verdict.record is not None:
                    log.info("node %s: its node secret is recorded (%s)", node_id,
                             "its certificate vouches for it" if certified else "first use")
                return
        raise WireError(f"node {node_id!r} registered from several places at once; try again.")

    def forget(self, node_id: str) -> bool:
        """Empty `node_id`'s record: its next Register records a new secret. True when there was one. Blocking."""
        key = identity_key(node_id)
        while True:
            stored = self.store.get(key)
            if not stored:
                return False
            if self.store.swap(key, stored, ""):
                return True

"""The agent's KV-event listeners: one ZMQ SUB socket per vLLM shard, connected to the IPC socket the shard's
engine binds (`ShardSpec.kv_events_endpoint`, in `--kv-events-config`, in the agent's 0700 directory:
`llmgw.agent.kv_sockets`), or, for an engine an older agent started, bound on the loopback port it publishes to
(`ShardSpec.kv_events_port`).

`KvWatch.follow(view)` is called on every shard change (and for each shard adopted at start): it starts the
shard's listener once (the endpoint is in the shard's record, so a restarted agent connects to the same one, or binds the same
port, and the events reach it again within seconds), empties the mirror when the engine's process changes (a restarted engine
holds nothing), and stops the listener when the shard stops. `current()` is every followed shard's mirror as
`ShardBlocks`, which each connection turns into messages (`llmgw.agent.kv_forwarding`). A port that cannot be
bound is retried every `rebind_interval` seconds (logged): the engine keeps serving, routing falls back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio
import zmq

from llmgw.agent.kv_forwarding import ShardBlocks
from llmgw.agent.shards import ShardView
from llmgw.engines.vllm import block_hashing
from llmgw.engines.vllm_kv_listener import KvEventListener
from llmgw.identity import ShardState

log = logging.getLogger("llmgw.agent.kv")


@dataclass
class _Followed:
    listener: KvEventListener
    scope: trio.CancelScope
    replica_id: str
    hash_algorithm: str
    hash_seed: str
    pid: int = 0
    cached_at: int = -1
    cached: frozenset[int] = frozenset()


class KvWatch:
    """Every vLLM shard's KV-event listener, run in `nursery`. `changed` is set (and replaced) after any mirror
    changed; `generation` counts those changes."""

    def __init__(self, nursery: trio.Nursery, *, host: str = "127.0.0.1", rebind_interval: float = 5.0):
        self.nursery = nursery
        self.host = host
        self.rebind_interval = rebind_interval
        self.changed = trio.Event()
        self.generation = 0
        self._followed: dict[str, _Followed] = {}

    def _touch(self) -> None:
        self.generation += 1
        self.changed.set()
        self.changed = trio.Event()

    def follow(self, view: ShardView) -> None:
        """Act on one shard's new view: start its listener, reset its mirror, or stop it (see the module)."""
        spec = view.spec
        followed = self._followed.get(view.shard_id)
        if view.state is ShardState.STOPPED or spec is None or not (spec.kv_events_endpoint or spec.kv_events_port):
            if followed is not None and view.state is ShardState.STOPPED:
                followed.scope.cancel()
                del self._followed[view.shard_id]
                self._touch()
            return
        if followed is None:
            if not view.pid:  # no engine runs (a shard failed before it started): nothing to listen to
                return
            algorithm, seed = block_hashing(spec.argv, spec.env)
            listener = KvEventListener(host=self.host, port=spec.kv_events_port, on_change=self._touch,
                                       endpoint=spec.kv_events_endpoint)
            followed = _Followed(listener, trio.CancelScope(), spec.replica_id, algorithm, seed, pid=view.pid)
            self._followed[view.shard_id] = followed
            self.nursery.start_soon(self._listen, view.shard_id, followed)
            self._touch()
        elif view.pid != followed.pid or view.state is ShardState.FAILED:
            if followed.listener.blocks.groups:
                log.info("shard %s: its engine restarted; forgetting the blocks it held", view.shard_id)
                followed.listener.reset()
            followed.pid = view.pid

    async def _listen(self, shard_id: str, followed: _Followed) -> None:
        with followed.scope:
            while True:
                try:
                    await followed.listener.run()
                except zmq.ZMQError as exc:
                    where = followed.listener.endpoint or f"{self.host}:{followed.listener.port}"
                    log.warning("shard %s: cannot receive KV events on %s (%s); retrying in %g s", shard_id,
                                where, exc, self.rebind_interval)
                await trio.sleep(self.rebind_interval)

    def current(self) -> dict[str, ShardBlocks]:
        """Every followed shard's mirror now, by shard id (the held set is recomputed only after a change)."""
        out = {}
        for shard_id, followed in self._followed.items():
            blocks = followed.listener.blocks
            if followed.cached_at != followed.listener.messages + blocks.resets:
                followed.cached, followed.cached_at = blocks.held(), followed.listener.messages + blocks.resets
            out[shard_id] = ShardBlocks(shard_id, followed.replica_id, followed.cached, blocks.block_size,
                                        blocks.resets, followed.hash_algorithm, followed.hash_seed)
        return out

    def listener(self, shard_id: str) -> KvEventListener | None:
        """The listener of `shard_id` (None when not followed): its counters say what arrived."""
        followed = self._followed.get(shard_id)
        return followed.listener if followed else None

"""What the control-plane process and its gateway worker processes say to each other (`llmgw.gateway.workers`).

One `socket.socketpair(AF_UNIX, SOCK_STREAM)` per worker, made by the control plane and inherited by the worker:
never a network socket, so the engine keys inside the routing table stay among the machine's own processes.
Framing: a 4-byte big-endian length, then that many bytes of UTF-8 JSON (one object with a "type").

Control plane -> worker:
    {"type": "start", "store": URL, "spool_dir": PATH, "host": H, "port": P, "index": K, "otlp_endpoint": URL|null,
     "request_sample_ratio": R}                                            first, once
    {"type": "table", "table": <RouteTable>}                               on (re)start and on every change
    {"type": "kv_blocks", "full": bool, "version": V, "replicas": {id: <ReplicaBlocks> | null}}
        the replicas whose blocks changed since the last message (null: gone); `full` replaces everything known
    {"type": "load", "outstanding": {replica id: requests in flight through the OTHER workers}}
    {"type": "health", "details": {...}}                                   what GET /health adds (leader, recovering)
Worker -> control plane:
    {"type": "ready", "port": P, "pid": PID}                               serving (after the first table)
    {"type": "load", "outstanding": {replica id: requests in flight through this worker}}
    {"type": "held", "held": {model: requests this worker holds while the model wakes}}   on every change

The codec of `RouteTable` and `BlockSnapshot` is here (`table_to_json` / `table_from_json`, `blocks_to_json` /
`replica_blocks_from_json`): plain JSON of the dataclasses' fields; pure, round-trips exactly.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import trio

from llmgw.errors import LlmgwError
from llmgw.identity import Quota, Routing
from llmgw.routes import BlockSnapshot, ModelRoute, ProjectPolicy, ReplicaBlocks, ReplicaRoute, ReplicaSpeed, RouteTable

MAX_MESSAGE_BYTES = 1 << 30
"""A message longer than this (1 GiB) is refused: it can only be a broken peer."""
_LENGTH = struct.Struct(">I")


class FeedError(LlmgwError):
    """The other end of a feed sent something that is not a message (a bug, or a process that is not llmgw's)."""


class MessageStream:
    """Length-prefixed JSON messages over a trio stream (a `trio.SocketStream` of one end of the socketpair).

    `send(message)` writes one message (a checkpoint); `receive()` returns the next one, or None at the end of the
    stream or when it was reset (the other process is gone: a process killed with unread data in its socket resets
    it). Raises FeedError for a frame over MAX_MESSAGE_BYTES or that is not JSON.
    One task sends and one receives at a time (trio's stream rules; `send` holds a lock for several senders).
    """

    def __init__(self, stream: trio.abc.Stream):
        self.stream = stream
        self._buffer = bytearray()
        self._send_lock = trio.Lock()

    async def send(self, message: Mapping[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":")).encode()
        async with self._send_lock:
            await self.stream.send_all(_LENGTH.pack(len(data)) + data)

    async def _fill(self, size: int) -> bool:
        while len(self._buffer) < size:
            try:
                chunk = await self.stream.receive_some(1 << 20)
            except trio.BrokenResourceError:  # reset: the other process died
                return False
            if not chunk:
                return False
            self._buffer += chunk
        return True

    async def receive(self) -> dict[str, Any] | None:
        if not await self._fill(_LENGTH.size):
            return None
        (length,) = _LENGTH.unpack_from(self._buffer)
        if length > MAX_MESSAGE_BYTES:
            raise FeedError(f"a feed message of {length} bytes is over the limit ({MAX_MESSAGE_BYTES}).")
        if not await self._fill(_LENGTH.size + length):
            return None
        data = bytes(self._buffer[_LENGTH.size:_LENGTH.size + length])
        del self._buffer[:_LENGTH.size + length]
        try:
            message = json.loads(data)
        except ValueError as exc:
            raise FeedError(f"a feed message is not JSON: {data[:80]!r}") from exc
        if not isinstance(message, dict):
            raise FeedError(f"a feed message is not a JSON object: {data[:80]!r}")
        return message

    async def aclose(self) -> None:
        await self.stream.aclose()


def _quota_to_json(quota: Quota) -> dict[str, Any]:
    return {name: getattr(quota, name) for name in ("requests_per_minute", "tokens_per_minute", "tokens_per_day",
                                                    "concurrent_requests", "budget")}


def table_to_json(table: RouteTable) -> dict[str, Any]:
    """`table` as JSON-ready data (every field; engine keys included: send it only over the inherited pair)."""
    return {
        "models": {name: {"name": m.name, "aliases": list(m.aliases),
                          "replicas": [{**vars(r), "speed": vars(r.speed) if r.speed else None}
                                       for r in m.replicas],
                          "prompt_price_per_million": m.prompt_price_per_million,
                          "completion_price_per_million": m.completion_price_per_million, "created": m.created,
                          "adapter_of": m.adapter_of, "body_fields": dict(m.body_fields),
                          "routing": m.routing.value, "context_size": m.context_size, "engine": m.engine,
                          "rerank": m.rerank, "batch_prompt_price_per_million": m.batch_prompt_price_per_million,
                          "batch_completion_price_per_million": m.batch_completion_price_per_million,
                          "canary_share": m.canary_share, "wakes": m.wakes, "off": m.off}
                   for name, m in table.models.items()},
        "projects": {name: {"name": p.name, "team": p.team, "organisation": p.organisation,
                            "models": sorted(p.models) if p.models is not None else None,
                            "quotas": [[scope, _quota_to_json(q)] for scope, q in p.quotas]}
                     for name, p in table.projects.items()},
        "stopped": table.stopped, "settings_commit": table.settings_commit,
        "max_request_body_bytes": table.max_request_body_bytes, "currency": table.currency,
        "responses_retention_seconds": table.responses_retention_seconds, "max_file_bytes": table.max_file_bytes,
        "files_retention_seconds": table.files_retention_seconds, "batch_slot_share": table.batch_slot_share,
    }


def table_from_json(data: Mapping[str, Any]) -> RouteTable:
    """The RouteTable `table_to_json` made. Raises FeedError when a field is missing or of another shape."""
    try:
        models = {name: ModelRoute(name=m["name"], aliases=tuple(m["aliases"]),
                                   replicas=tuple(_replica_from_json(r) for r in m["replicas"]),
                                   prompt_price_per_million=m["prompt_price_per_million"],
                                   completion_price_per_million=m["completion_price_per_million"],
                                   created=m["created"], adapter_of=m["adapter_of"],
                                   body_fields=MappingProxyType(dict(m["body_fields"])),
                                   routing=Routing(m["routing"]), context_size=m["context_size"],
                                   engine=m["engine"], rerank=m["rerank"],
                                   batch_prompt_price_per_million=m["batch_prompt_price_per_million"],
                                   batch_completion_price_per_million=m["batch_completion_price_per_million"],
                                   canary_share=m.get("canary_share"),
                                   wakes=bool(m.get("wakes", False)), off=bool(m.get("off", False)))
                  for name, m in data["models"].items()}
        projects = {name: ProjectPolicy(name=p["name"], team=p["team"], organisation=p["organisation"],
                                        models=frozenset(p["models"]) if p["models"] is not None else None,
                                        quotas=tuple((scope, Quota(**q)) for scope, q in p["quotas"]))
                    for name, p in data["projects"].items()}
        return RouteTable(models=MappingProxyType(models), projects=MappingProxyType(projects),
                          stopped=data["stopped"], settings_commit=data["settings_commit"],
                          max_request_body_bytes=data["max_request_body_bytes"], currency=data["currency"],
                          responses_retention_seconds=data["responses_retention_seconds"],
                          max_file_bytes=data["max_file_bytes"], files_retention_seconds=data["files_retention_seconds"],
                          batch_slot_share=data["batch_slot_share"])
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise FeedError(f"a routing table in the feed is not well formed ({exc!r}).") from exc


def _replica_from_json(data: Mapping[str, Any]) -> ReplicaRoute:
    speed = data.get("speed")
    return ReplicaRoute(**{**data, "speed": ReplicaSpeed(**speed) if speed else None})


def replica_blocks_to_json(blocks: ReplicaBlocks) -> dict[str, Any]:
    """One replica's held blocks as JSON-ready data (block hashes as integers, sorted)."""
    return {"blocks": sorted(blocks.blocks), "block_size": blocks.block_size, "hash_algorithm": blocks.hash_algorithm,
            "hash_seed": blocks.hash_seed, "node_id": blocks.node_id}


def replica_blocks_from_json(data: Mapping[str, Any]) -> ReplicaBlocks:
    """The ReplicaBlocks `replica_blocks_to_json` made. Raises FeedError for another shape."""
    try:
        return ReplicaBlocks(blocks=frozenset(data["blocks"]), block_size=data["block_size"],
                             hash_algorithm=data["hash_algorithm"], hash_seed=data["hash_seed"],
                             node_id=data["node_id"])
    except (KeyError, TypeError) as exc:
        raise FeedError(f"KV blocks in the feed are not well formed ({exc!r}).") from exc


def blocks_message(new: BlockSnapshot, old: BlockSnapshot | None) -> dict[str, Any] | None:
    """The `kv_blocks` message that brings a worker holding `old` (None: nothing yet) to `new`: the replicas whose
    entry is another object than in `old` (snapshots share unchanged entries), and null for those gone.
    None when nothing changed. Pure."""
    if old is not None and new is old:
        return None
    before = old.replicas if old is not None else {}
    changed: dict[str, Any] = {rid: replica_blocks_to_json(b) for rid, b in new.replicas.items()
                               if before.get(rid) is not b}
    changed.update({rid: None for rid in before if rid not in new.replicas})
    if old is not None and not changed:
        return None
    return {"type": "kv_blocks", "full": old is None, "version": new.version, "replicas": changed}


def apply_blocks_message(snapshot: BlockSnapshot, message: Mapping[str, Any]) -> BlockSnapshot:
    """`snapshot` after a `kv_blocks` message (a `full` one replaces it). Pure; raises FeedError for another shape."""
    replicas = {} if message.get("full") else dict(snapshot.replicas)
    for rid, data in dict(message.get("replicas") or {}).items():
        if data is None:
            replicas.pop(rid, None)
        else:
            replicas[rid] = replica_blocks_from_json(data)
    return BlockSnapshot(replicas=MappingProxyType(replicas), version=int(message.get("version", 0)))

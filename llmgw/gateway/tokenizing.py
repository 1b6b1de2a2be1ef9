"""The prompt's token ids for precise prefix routing, from the engine itself: vLLM's `POST /tokenize`.

Asking the engine rather than tokenising in the gateway: the engine applies its own chat template and special tokens
exactly as it will for the request, the gateway needs no tokenizer files (the weights live on the nodes, not where
the gateway runs) and no `tokenizers`/`jinja2` reproduction of vLLM's template handling. The cost is one loopback
or LAN round trip on the engine's API server (measured in bench/tokenize_cost.py; docs/engines.md has the figures).
A failure or a slow answer (over `TOKENIZE_TIMEOUT` seconds) only turns routing back to the approximate policy.
Format: vLLM's `/tokenize` answer `{"count": N, "max_model_len": M, "tokens": [...]}` (fixtures' tokenize.json).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import trio

from llmgw.gateway.upstream import UpstreamFailure, UpstreamPool
from llmgw.routes import ReplicaRoute

log = logging.getLogger("llmgw.gateway")

TOKENIZE_PATH = "/tokenize"
TOKENIZE_TIMEOUT = 2.0


def parse_tokens(raw: bytes) -> list[int] | None:
    """The `tokens` of a `/tokenize` answer; None when it is not that shape. Pure; never raises."""
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    tokens = data.get("tokens") if isinstance(data, Mapping) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        return None
    return tokens


async def engine_tokens(pool: UpstreamPool, replica: ReplicaRoute, request: Mapping[str, Any], *,
                        timeout: float = TOKENIZE_TIMEOUT) -> list[int] | None:
    """POST `request` (`routing_prefix.tokenize_body`) to `replica`'s `/tokenize` with its replica key; the token
    ids, or None when the engine fails, answers other than 200, or takes over `timeout` seconds (logged at debug
    level: the caller falls back). A checkpoint; cancellable."""
    headers = [(b"content-type", b"application/json"), (b"accept", b"application/json")]
    if replica.replica_key:
        headers.append((b"authorization", b"Bearer " + replica.replica_key.encode()))
    payload = json.dumps(request, separators=(",", ":")).encode()
    with trio.move_on_after(timeout):
        try:
            response = await pool.request("POST", replica.base_url.rstrip("/") + TOKENIZE_PATH, headers, payload)
            try:
                raw = await response.read()
            finally:
                await response.aclose()
        except UpstreamFailure as exc:
            log.debug("replica %s: /tokenize failed: %s", replica.replica_id, exc)
            return None
        if response.status != 200:
            log.debug("replica %s: /tokenize answered %d", replica.replica_id, response.status)
            return None
        return parse_tokens(raw)
    log.debug("replica %s: /tokenize took over %g s", replica.replica_id, timeout)
    return None

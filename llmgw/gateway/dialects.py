"""The endpoints beside OpenAI's chat, completions and embeddings: Anthropic's Messages API (`/v1/messages`,
`/v1/messages/count_tokens`, `anthropic_endpoint`) and reranking (`/v1/rerank`, `/v1/score`, `rerank`).

Each goes through the same steps as a chat request (`Gateway._proxied`): the request's ids and trace, the API key
(`Authorization: Bearer`, `x-api-key` or `api-key`), its project, the body (bounded, `validation.parse_body`), then
the dialect's own check and admission (`admission.Admission.admit`: the model, the project's allowlist, serving
stopped?, a ready replica, the quota reservation), the forward and the settlement (usage recorded, billed as chat).
A refusal is answered in the dialect's error shape: Anthropic's `{"type": "error", "error": {"type", "message"}}`
for the Messages API, OpenAI's for rerank and score.
"""

from __future__ import annotations

import time

from llmgw.gateway.admission import project_of
from llmgw.gateway.anthropic import COUNT_TOKENS_PATH, MESSAGES_PATH, check_version, refused
from llmgw.gateway.anthropic_endpoint import count_tokens, messages
from llmgw.gateway.asgi import header_map, send_bytes
from llmgw.gateway.dialect_request import Incoming
from llmgw.gateway.problems import ApiError
from llmgw.gateway.request_context import STATUS_CLIENT_CLOSED, Caller
from llmgw.gateway.rerank import RERANK_PATH, SCORE_PATH, rerank
from llmgw.gateway.validation import parse_body

HANDLERS = {MESSAGES_PATH: messages, COUNT_TOKENS_PATH: count_tokens, RERANK_PATH: rerank, SCORE_PATH: rerank}
"""The paths served here and their handler: `await handler(gateway, incoming, send, receive)` (`Incoming`)."""


async def serve_dialect(gateway, scope, receive, send, path: str, method: str) -> None:
    """Serve one request to a path of HANDLERS for `gateway` (an `llmgw.gateway.Gateway`). Answers every refusal
    itself (in the dialect's shape, with the request's id headers); raises `asgi.Disconnected` when the client left
    while its body was read. A checkpoint."""
    started = time.perf_counter()
    headers = header_map(scope)
    ids, trace = gateway._ids(path, headers)
    anthropic = path.startswith(MESSAGES_PATH)
    try:
        if method != "POST":
            raise ApiError(405, f"{path} takes POST.", "invalid_request_error", "method_not_allowed")
        if anthropic:
            check_version(headers.get(b"anthropic-version"))
        key = await gateway.admission.authenticate(headers)
        table = gateway.table
        caller = Caller(key, project_of(table, key), ids, trace, started)
        raw = await gateway.admission.receive_body(caller, table, receive, headers)
        await HANDLERS[path](gateway, Incoming(caller, table, path, parse_body(raw), raw), send, receive)
    except ApiError as error:
        if trace is not None:
            trace.end(error.status)
        await send_bytes(send, error.status, refused(error) if anthropic else error.body(),
                         headers=[*error.headers, *ids.headers()])
    finally:
        if trace is not None:  # a request that ended without a settlement (a disconnect while reading)
            trace.end(STATUS_CLIENT_CLOSED)

"""One proxied request after admission: pick a replica, forward, relay the answer, and say what it cost.

`open_upstream` sends the (rewritten) body to a replica chosen by the route's routing policy (`routing_policies`,
from the request's `RequestContext`) over the Balancer's load and facts, retrying once on another replica when the
first failed before any response byte (refused, reset, engine 5xx, engine 401); a replica that refused the connection
is ejected for the balancer's cooldown. Non-streamed answers are read whole (usage taken from them); streams are
relayed event by event through SseRelay. A failure after the first streamed byte ends the stream with an
OpenAI-style error event. The request's `Ledger` (`request_context`) records the replica, tokens, TTFT and status
for settling and usage.

Engine answers, mapped (issue 19): a 4xx reaches the client with the same status and the engine's own message, in
OpenAI's error shape (`problems.engine_error`), except a 401, which means the engine refused llmgw's engine key (the
operator's fault, not the client's): that is a 502. A 5xx, a refused connection or a broken answer is a 502 (504 for
a timeout) naming the model, never the engine's address or key; the engine's words go to the log instead.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping

import trio

from llmgw.gateway.problems import ApiError, engine_error, upstream_failed
from llmgw.gateway.request_context import Ledger, RequestContext
from llmgw.gateway.routing import Balancer, PromptBlocks
from llmgw.gateway.streaming import SseRelay, error_event, usage_numbers
from llmgw.gateway.upstream import UpstreamFailure, UpstreamPool, UpstreamResponse
from llmgw.routes import ReplicaRoute

log = logging.getLogger("llmgw.gateway")
EVENT_STREAM = b"text/event-stream"
USAGE_OPTION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
"""The engine paths whose streams carry usage only when asked (`stream_options.include_usage`, set by
`upstream_body`); an engine's own `/v1/responses` and `/v1/messages` streams always end with theirs."""
_JSON_HEADERS = ((b"content-type", b"application/json"), (b"accept", b"application/json"))
_STREAM_HEADERS = ((b"content-type", b"application/json"), (b"accept", EVENT_STREAM))


def upstream_body(body: dict, raw: bytes, replica: ReplicaRoute, stream: bool, catalog_name: str | None = None,
                  overrides: Mapping | None = None) -> bytes:
    """The bytes to send upstream: the client's body with `model` set to what the replica serves, for streams
    `stream_options.include_usage` true, and the top-level fields of `overrides` (e.g. the reserved `max_tokens`).

    `model` becomes the replica's `upstream_model` when set; else, for a replica llmgw runs (not `external`), the
    catalog name (`catalog_name`), which is the engine's served name whatever alias the client used. Every other
    field passes untouched; `raw` is sent as is when nothing changes.
    """
    model = replica.upstream_model
    if model is None and not replica.external:
        model = catalog_name
    if not stream and not overrides and (model is None or model == body.get("model")):
        return raw
    copy = dict(body)
    if model is not None:
        copy["model"] = model
    if stream:
        options = copy.get("stream_options")
        copy["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    if overrides:
        copy.update(overrides)
    return json.dumps(copy, separators=(",", ":")).encode()


def _engine_headers(ctx: RequestContext, replica: ReplicaRoute) -> list[tuple[bytes, bytes]]:
    """The headers of a request to `replica`'s engine: JSON in, JSON or an event stream out, the replica's key, the
    gateway's request id as `x-request-id`; for a line of a batch to a replica llmgw runs, the line's key as
    `llmgw-once`, so that its engine relay runs it once whoever sends it again (`llmgw.engines.relay_once`)."""
    headers = list(_STREAM_HEADERS if ctx.stream else _JSON_HEADERS)
    if replica.replica_key:
        headers.append((b"authorization", b"Bearer " + replica.replica_key.encode()))
    headers.append((b"x-request-id", ctx.caller.ids.own.encode()))
    if ctx.caller.once is not None and not replica.external:
        headers.append((b"llmgw-once", ctx.caller.once.encode()))
    return headers


def output_tokens(ctx: RequestContext) -> int:
    """The completion tokens `ctx`'s request may make: the `max_tokens` (or `max_completion_tokens`) forced or
    asked; 0 when none is set (the routing policy then assumes its default). Pure."""
    for source in (ctx.overrides, ctx.body):
        for name in ("max_tokens", "max_completion_tokens"):
            value = source.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0


async def open_upstream(ctx: RequestContext, pool: UpstreamPool, balancer: Balancer, ledger: Ledger,
                        blocks: PromptBlocks | None = None) -> UpstreamResponse:
    """Send `ctx`'s request to a replica its route's policy chooses, retrying once elsewhere on a failure before the
    first byte.

    Each try asks `ctx.policy` (`routing_policies`) to choose among `ctx.route.replicas` (the first try: on the side
    of a canary split its turn says, `Balancer.canary_pool`) under `balancer.load()` and
    `balancer.facts(...)` (with `ctx.prefix` and `blocks`: the prompt's blocks and what each replica holds, None when
    precise routing is off for it); `ledger.routing` says which kind of decision it was. The body sent is
    `upstream_body` of `ctx.body` with the route's `body_fields` under `ctx.overrides`; the engine gets the gateway's
    request id as `x-request-id`.

    The replica stays counted as outstanding in `balancer` until the caller calls `balancer.finished(replica_id)`
    for `ledger.replica`. `ledger.sent_to_engine` is True while the request has reached an engine that has not
    failed. Raises ApiError 502/504 (naming the model only) when both tries failed. A checkpoint.
    """

    def sent() -> None:
        ledger.sent_to_engine = True

    route = ctx.route
    overrides = ctx.overrides
    tried: set[str] = set()
    failure: ApiError | None = None
    for _attempt in range(2):
        now = trio.current_time()
        replicas = route.replicas if tried else balancer.canary_pool(route)  # a retry goes anywhere not tried yet
        facts = balancer.facts(replicas, now, frozenset(tried), ctx.prefix, blocks,
                               (ctx.prompt_estimate, output_tokens(ctx)))
        choice = ctx.policy.choose(replicas, balancer.load(), facts)
        replica, ledger.routing = choice.replica, choice.kind
        balancer.remember(ctx.prefix, replica)
        if replica is None:
            break
        tried.add(replica.replica_id)
        fields = ({**route.body_fields, **overrides} if route.body_fields and overrides
                  else route.body_fields or overrides)
        payload = upstream_body(ctx.body, ctx.raw, replica, ctx.stream and ctx.path in USAGE_OPTION_PATHS,
                                route.name, fields)
        balancer.started(replica.replica_id)
        try:
            response = await pool.request("POST", replica.base_url.rstrip("/") + ctx.path,
                                          _engine_headers(ctx, replica), payload, on_sent=sent)
        except UpstreamFailure as exc:
            ledger.sent_to_engine = False
            balancer.finished(replica.replica_id)
            if exc.refused:
                balancer.eject(replica.replica_id, now)
            log.warning("model %s replica %s: %s", route.name, replica.replica_id, exc)
            failure = upstream_failed(f"The engine for model '{route.name}' failed"
                                      f"{' to answer in time' if exc.status == 504 else ''}; try again.", exc.status)
            continue
        except BaseException:
            balancer.finished(replica.replica_id)
            raise
        if response.status >= 500 or response.status == 401:
            try:
                failure = await _refused_by_engine(route.name, replica, response)
            finally:
                balancer.finished(replica.replica_id)
            ledger.sent_to_engine = False
            continue
        ledger.replica = replica
        return response
    raise failure or upstream_failed(f"No replica of model '{route.name}' could take the request.", 502)


async def _refused_by_engine(model: str, replica: ReplicaRoute, response: UpstreamResponse) -> ApiError:
    """The 502 for an engine's 5xx or 401 (read at most 5 s, then the response is closed): the engine's own words
    (its address and key hidden) for a 5xx, the operator's key problem for a 401; the answer goes to the log."""
    raw_detail = b""
    try:
        with trio.move_on_after(5):
            raw_detail = (await response.read())[:2000]
    except UpstreamFailure:
        pass
    finally:
        await response.aclose()
    detail = raw_detail[:300].decode("utf-8", "replace")
    log.warning("model %s replica %s: the engine answered %d: %s", model, replica.replica_id, response.status, detail)
    if response.status == 401:
        why = "refused llmgw's replica key (the operator must check it); try again"
    else:  # the engine's own words say what went wrong; its address and key never reach the client
        netloc = _netloc(replica.base_url)
        said = engine_error(response.status, raw_detail, hide=[
            replica.replica_key or "", netloc, netloc.rsplit(":", 1)[0].strip("[]")]).message
        why = (f"failed (status {response.status}): {said}" if said
               else f"failed (status {response.status}); try again")
    return upstream_failed(f"The engine for model '{model}' {why}", 502)


async def relay_whole(ctx: RequestContext, response: UpstreamResponse, send, ledger: Ledger,
                      headers: list[tuple[bytes, bytes]], before_send) -> None:
    """Read a non-streamed answer, take its usage into `ledger`, await `before_send()` (settling), then send it
    (ASGI `send`) with `headers` added, its `model` the one the client named (`ctx.requested`)."""
    client_model = ctx.requested
    body = await response.read()
    ledger.status = response.status
    if response.status >= 400:
        await _relay_engine_error(response, body, send, ledger, headers, before_send)
        return
    if response.status == 200:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            usage = parsed.get("usage")
            if isinstance(usage, dict):
                ledger.prompt_tokens, ledger.completion_tokens, ledger.cached_tokens = usage_numbers(usage)
            if "model" in parsed and parsed.get("model") != client_model:  # llama-server answers with its path
                parsed["model"] = client_model
                body = json.dumps(parsed).encode()
    await before_send()
    content_type = response.header(b"content-type") or b"application/json"
    out_headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": response.status, "headers": out_headers})
    ledger.started_response = True
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def relay_stream(ctx: RequestContext, response: UpstreamResponse, send, ledger: Ledger,
                       headers: list[tuple[bytes, bytes]], before_end) -> None:
    """Relay an event stream as it comes (ASGI `send`, `headers` added to the head), its tokens, usage and time to
    first token (from `ctx.caller.started`) into `ledger`; await `before_end()` (settling) before the final
    `[DONE]`.

    A non-200 answer is relayed whole instead. An engine failure mid-stream becomes an error event.
    """
    if response.status != 200 or not (response.header(b"content-type") or b"").startswith(EVENT_STREAM):
        await relay_whole(ctx, response, send, ledger, headers, before_end)
        return
    started_at = ctx.caller.started
    replica = ledger.replica
    relay = SseRelay(ctx.include_usage, client_model=ctx.requested,
                     upstream_model=replica.upstream_model if replica else None)
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"), *headers]})
    ledger.started_response = True
    ledger.status = 200
    tail = b""
    try:
        await _relay_events(response, relay, send, ledger, started_at)
        tail = relay.finish()
    except UpstreamFailure as exc:
        _take(relay, ledger, started_at)
        ledger.status = exc.status
        tail = relay.finish() + error_event(f"The engine failed mid-stream: {exc}", "server_error",
                                            "upstream_error")
        await before_end()
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return
    _take(relay, ledger, started_at)
    if relay.usage.error is not None:
        ledger.status = 502
    await before_end()
    if relay.usage.done:
        tail += b"data: [DONE]\n\n"
    await send({"type": "http.response.body", "body": tail, "more_body": False})


async def _relay_events(response: UpstreamResponse, relay: SseRelay, send, ledger: Ledger,
                        started_at: float) -> None:
    """Send each read's reshaped events as they come, until the engine's body ends.

    The engine's silence past its idle timeout is watched by one task per stream (`watch_idle`), not a cancel scope
    per read. Raises UpstreamFailure (a reset, a bad body, or silence: 504).
    """
    failure: UpstreamFailure | None = None
    message = {"type": "http.response.body", "body": b"", "more_body": True}
    with trio.CancelScope() as idle_scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(response.watch_idle, idle_scope)
            try:
                while data := await response.receive_watched():
                    out = relay.feed(data, time.perf_counter())
                    if out:
                        message["body"] = out
                        await send(message)
            except UpstreamFailure as exc:  # raised as itself, not grouped by the nursery
                failure = exc
            finally:  # the ledger is brought up to date once, however the loop ended (a client that left too)
                _take(relay, ledger, started_at)
            nursery.cancel_scope.cancel()
    if idle_scope.cancelled_caught:
        failure = response.idle_failure()
    if failure is not None:
        raise failure


async def _relay_engine_error(response: UpstreamResponse, body: bytes, send, ledger: Ledger,
                              headers: list[tuple[bytes, bytes]], before_send) -> None:
    """An engine's 4xx in OpenAI's shape with its status and words (nothing billed: the engine refused the work)."""
    replica = ledger.replica
    error = engine_error(response.status, body, hide=[replica.replica_key or "", _netloc(replica.base_url)]
                         if replica else [])
    ledger.prompt_tokens = ledger.completion_tokens = 0
    ledger.sent_to_engine = False
    retry_after = response.header(b"retry-after")
    extra = [(b"retry-after", retry_after)] if retry_after and retry_after.isdigit() else []
    await before_send()
    payload = error.body()
    await send({"type": "http.response.start", "status": error.status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *extra, *headers]})
    ledger.started_response = True
    await send({"type": "http.response.body", "body": payload, "more_body": False})


def _netloc(url: str) -> str:
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0]


def _take(relay: SseRelay, ledger: Ledger, started_at: float) -> None:
    usage = relay.usage
    ledger.counted_chunks = usage.counted_chunks
    if usage.prompt_tokens is not None:
        ledger.prompt_tokens = usage.prompt_tokens
        ledger.completion_tokens = usage.completion_tokens
        ledger.cached_tokens = usage.cached_tokens
    if usage.first_token_at is not None and ledger.ttft_seconds is None:
        ledger.ttft_seconds = max(0.0, usage.first_token_at - started_at)

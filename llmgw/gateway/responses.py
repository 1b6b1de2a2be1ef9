"""`/v1/responses`: OpenAI's Responses API with its state kept by the gateway, served by the engine's own
`/v1/responses` where it has one (`native`), else through chat.

Endpoints (`ResponsesApi.serve`):
- `POST /v1/responses`: the key and project (`admission`), the body (bounded JSON, OpenAI's `CreateResponse`
  schema: `validation`), `previous_response_id` expanded from the store into the whole context (the response of
  another project, or one past its retention, is a 400 `previous_response_not_found` as OpenAI answers), the chat
  request (`responses_chat`), then admission of that chat request (model, allowlist, quotas) and `Gateway._run`:
  where the route's engine serves `/v1/responses` (`native.serves_natively`), the whole context is sent there
  (`native.responses_engine_body`: no previous_response_id, `store: false`) and relayed by
  `native_relay.NativeResponsesRelay` (the engine's answer in the gateway's Response frame); otherwise the chat
  request goes to the engine with a `ResponsesRelay`: the engine's chat answer becomes the Response object, or its
  stream the Responses event sequence (`responses_events`). Usage is billed as chat's (the engine's prompt, completion and cached tokens; a
  client that leaves mid-stream is billed its prompt and the content chunks relayed).
  Unless `store` is false, the served response is stored (`llmgw.store.responses`: the whole context, the output
  items, the usage, the model, the project) before its last byte goes out, kept for `store.responses_retention`
  (the table's `responses_retention_seconds`, default 30 days). Any replica, and any gateway process or control
  plane on the same store, can serve the next turn.
- `GET /v1/responses/{id}`: the stored Response object; `DELETE /v1/responses/{id}`: deletes it. Both for the
  owning project only: another project's id, like an unknown or expired one, is a 404.
- `GET /v1/responses/{id}/input_items`: the stored context's items (OpenAI's list shape, `order` asc or desc).
- `POST /v1/responses/input_tokens`: the prompt tokens the request would use (context expanded, translated to chat),
  counted by an engine of the model: vLLM's `/tokenize` with the messages, else llama-server's `/apply-template`
  then `/tokenize`; not billed. Answer: `{"object": "response.input_tokens", "input_tokens": N}`.

What is stored is prompts and answers: it is never written to a log (a failed store write logs the response id and
the error only). Expired responses are purged every PURGE_INTERVAL seconds (`purge_expired_periodically`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import trio

from llmgw.errors import LlmgwError
from llmgw.gateway.admission import project_of
from llmgw.gateway.asgi import send_json
from llmgw.gateway.files import guarded_call
from llmgw.gateway.native import RESPONSES, responses_engine_body, serves_natively
from llmgw.gateway.native_relay import NativeResponsesRelay
from llmgw.gateway.problems import ApiError, bad_request, model_not_found, forbidden
from llmgw.gateway.proxying import EVENT_STREAM, relay_whole
from llmgw.gateway.request_context import Caller, Ledger, RequestContext
from llmgw.gateway.request_ids import RequestIds
from llmgw.gateway.responses_chat import (
    chat_request, context_items, new_id, output_items, response_object, response_usage,
)
from llmgw.gateway.responses_events import ResponseEvents
from llmgw.gateway.streaming import usage_numbers
from llmgw.gateway.tokenizing import engine_tokens
from llmgw.gateway.tracing import RequestTrace
from llmgw.gateway.upstream import UpstreamFailure
from llmgw.gateway.validation import parse_body, validate_request
from llmgw.store import StoredResponse

log = logging.getLogger("llmgw.gateway")
PREFIX = "/v1/responses"
CHAT_PATH = "/v1/chat/completions"
PURGE_INTERVAL = 3600.0
"""Seconds between two purges of expired responses by one gateway process."""


class ResponsesApi:
    """The `/v1/responses` endpoints of one `Gateway` (`gateway`: its admission, accounting, table, pool)."""

    def __init__(self, gateway) -> None:
        self.gateway = gateway

    async def serve(self, scope, receive, send, headers: dict[bytes, bytes], ids: RequestIds,
                    trace: RequestTrace | None) -> None:
        """Answer one request under PREFIX. Raises ApiError for a refusal (answered by the caller)."""
        path, method = scope["path"], scope["method"]
        rest = path[len(PREFIX):].strip("/")
        if rest in ("", "input_tokens"):
            if method != "POST":
                raise ApiError(405, f"{path} takes POST.", "invalid_request_error", "method_not_allowed")
            if rest == "":
                await self._create(receive, send, headers, ids, trace)
            else:
                await self._input_tokens(receive, send, headers, ids, trace)
            return
        response_id, _, tail = rest.partition("/")
        caller = await self._caller(headers, ids, trace)
        if tail == "input_items" and method == "GET":
            stored = await self._stored(caller, response_id)
            await _answer(send, input_item_list(stored.input, scope.get("query_string", b"")), ids, trace)
        elif tail == "" and method == "GET":
            await _answer(send, (await self._stored(caller, response_id)).response, ids, trace)
        elif tail == "" and method == "DELETE":
            accounting = self.gateway.accounting
            if not await self._store_call(accounting.store.delete_response, response_id, caller.project.name):
                raise _not_found(response_id)
            await _answer(send, {"id": response_id, "object": "response", "deleted": True}, ids, trace)
        else:
            raise ApiError(404, f"There is no {method} {path} here.", "invalid_request_error", "unknown_url")

    async def _caller(self, headers, ids: RequestIds, trace: RequestTrace | None) -> Caller:
        started = time.perf_counter()
        key = await self.gateway.admission.authenticate(headers)
        return Caller(key, project_of(self.gateway.table, key), ids, trace, started)

    async def _store_call(self, function, *args):
        """A store call in a worker thread; a store failure is a 503 (`files.guarded_call`)."""
        return await guarded_call(self.gateway.accounting, "responses", function, *args)

    async def _stored(self, caller: Caller, response_id: str) -> StoredResponse:
        stored = await self._store_call(self.gateway.accounting.store.load_response, response_id,
                                        caller.project.name, time.time())
        if stored is None:
            raise _not_found(response_id)
        return stored

    async def _read(self, receive, headers, ids: RequestIds, trace: RequestTrace | None,
                    endpoint: str) -> tuple[Caller, dict, list[dict], dict]:
        """The caller, the checked body (`endpoint`'s schema), the whole context of the turn and the body as the
        client sent it (before `with_omitted_nullables`: what an engine's own endpoint is sent)."""
        caller = await self._caller(headers, ids, trace)
        raw = await self.gateway.admission.receive_body(caller, self.gateway.table, receive, headers)
        sent = parse_body(raw)
        body = with_omitted_nullables(sent)
        validate_request(endpoint, body)
        previous_id = body.get("previous_response_id")
        if previous_id is not None:
            previous = await self._store_call(self.gateway.accounting.store.load_response, previous_id,
                                              caller.project.name, time.time())
            if previous is None:
                raise bad_request(f"Previous response with id '{previous_id}' not found.",
                                  "previous_response_not_found", "previous_response_id")
            return (caller, body, context_items(previous.input, previous.response.get("output") or (), body),
                    sent)
        return caller, body, context_items((), (), body), sent

    async def _create(self, receive, send, headers, ids: RequestIds, trace: RequestTrace | None) -> None:
        """Admitted on the chat translation (its prompt bound and max tokens); then passed to the engine's own
        `/v1/responses` with the whole context when its engine serves it (`native`), else translated to chat."""
        caller, body, items, sent = await self._read(receive, headers, ids, trace, PREFIX)
        await self.create(caller, self.gateway.table, (body, items, sent), send, receive)

    async def create(self, caller: Caller, table, turn: tuple[dict, list[dict], dict], send, receive) -> None:
        """Admit and run one turn under `table`'s routes and quotas; the answer goes to `send`. `turn`: the checked
        body, the whole context's items and the body as sent, as `_read` gives them (or a batch's line:
        `batch_runner`)."""
        body, items, sent = turn
        chat = chat_request(body, items)
        gateway = self.gateway
        ctx = await gateway.admission.admit(caller, table, CHAT_PATH, chat,
                                            json.dumps(chat, separators=(",", ":")).encode())
        if not serves_natively(ctx.route, RESPONSES):
            await gateway._run(ctx, send, receive, ResponsesRelay(self, body, items))
            return
        engine_body = responses_engine_body(sent, items, ctx.route.name, ctx.overrides)
        native = dataclasses.replace(ctx, path=RESPONSES, body=engine_body, overrides={}, include_usage=False,
                                     raw=json.dumps(engine_body, separators=(",", ":")).encode())
        await gateway._run(native, send, receive, NativeResponsesRelay(
            self, body, items, new_id("resp"), translation=lambda: (ctx, ResponsesRelay(self, body, items))))

    async def _input_tokens(self, receive, send, headers, ids: RequestIds, trace: RequestTrace | None) -> None:
        caller, body, items, _sent = await self._read(receive, headers, ids, trace, PREFIX + "/input_tokens")
        chat = chat_request(body, items)
        table = self.gateway.table
        route = table.resolve(body.get("model") or "")
        if route is None:
            raise model_not_found(body.get("model") or "")
        if caller.project.models is not None and route.name not in caller.project.models:
            raise forbidden(f"The project '{caller.project.name}' may not use the model '{body.get('model')}'.")
        load = self.gateway.balancer.load()
        for replica in sorted(route.replicas, key=lambda r: load.get(r.replica_id, 0)):
            count = await count_tokens(self.gateway.pool, replica, chat, replica.upstream_model or route.name)
            if count is not None:
                await _answer(send, {"object": "response.input_tokens", "input_tokens": count}, ids, trace)
                return
        raise ApiError(503, f"No replica of model '{route.name}' could count the tokens; try again.",
                       "server_error", "model_not_ready", headers=[(b"retry-after", b"5")])

    async def save(self, ctx: RequestContext, items: list[dict], response: dict[str, Any]) -> None:
        """Store a served response (its context `items`), unless the request said `store: false`. A store failure
        is logged (the id and the error's kind only) and the answer goes out anyway."""
        now = time.time()
        stored = StoredResponse(id=response["id"], project=ctx.caller.project.name, created_at=now,
                                expires_at=now + self.gateway.table.responses_retention_seconds,
                                model=ctx.requested, input=items, response=response)
        try:
            await self.gateway.accounting.boundary.call(self.gateway.accounting.store.save_response, stored)
        except LlmgwError as error:
            log.warning("responses: %s was served but not stored: %s", response["id"], type(error).__name__)

    async def purge_expired_periodically(self, interval: float = PURGE_INTERVAL) -> None:
        """Delete expired responses from the store now and every `interval` seconds, until cancelled; a store
        failure is logged and tried again at the next interval."""
        while True:
            try:
                purged = await self.gateway.accounting.boundary.call(self.gateway.accounting.store.purge_responses,
                                                                     None, time.time())
                if purged:
                    log.info("responses: purged %d expired responses", purged)
            except LlmgwError as error:
                log.warning("responses: the purge of expired responses failed: %s", error)
            await trio.sleep(interval)


async def _answer(send, payload: dict, ids: RequestIds, trace: RequestTrace | None) -> None:
    """A 200 JSON answer with the request's ids; its span (if traced) ended with 200."""
    await send_json(send, 200, payload, ids.headers())
    if trace is not None:
        trace.end(200)


FUNCTION_TOOL_NULLABLES = ("strict", "parameters")


def with_omitted_nullables(body: Any) -> Any:
    """`body` with a function tool's omitted `strict` and `parameters` as null.

    OpenAI's published schema (`FunctionTool`) lists both as required though each may be null, and OpenAI's service
    and SDKs let a caller leave them out (`tools=[{"type": "function", "name": "f"}]`): an omitted one means null
    here, as there. Anything that is not a dict of tools is returned as it is, for the schema check to refuse.
    """
    tools = body.get("tools") if isinstance(body, dict) else None
    if not isinstance(tools, list):
        return body
    filled = [{**{key: None for key in FUNCTION_TOOL_NULLABLES}, **tool}
              if isinstance(tool, dict) and tool.get("type") == "function" else tool for tool in tools]
    return {**body, "tools": filled}


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"No response found with id '{response_id}'.", "invalid_request_error", "not_found")


def input_item_list(items: list[dict], query: bytes) -> dict[str, Any]:
    """OpenAI's list of input items (`order=asc|desc`, default desc; items without an id get "item_<index>", a
    message given without its `type` (an easy input message, `{"role", "content"}`) gets type "message")."""
    listed = [{"id": item.get("id") or f"item_{index}",
               **({"type": "message"} if "type" not in item and "role" in item else {}), **item}
              for index, item in enumerate(items)]
    if b"order=asc" not in query:
        listed.reverse()
    return {"object": "list", "data": listed, "first_id": listed[0]["id"] if listed else None,
            "last_id": listed[-1]["id"] if listed else None, "has_more": False}


async def count_tokens(pool, replica, chat: Mapping[str, Any], model: str) -> int | None:
    """The prompt tokens of the chat request `chat` on `replica`: vLLM's `/tokenize` with the messages, else
    llama-server's `/apply-template` then `/tokenize` of its prompt (with special tokens); None when neither
    answers. A checkpoint."""
    fields = {k: chat[k] for k in ("messages", "tools", "chat_template_kwargs") if k in chat}
    tokens = await engine_tokens(pool, replica, {"model": model, **fields})
    if tokens:  # llama-server's /tokenize answers [] to messages (it reads `content` only)
        return len(tokens)
    headers = [(b"content-type", b"application/json"), (b"accept", b"application/json")]
    if replica.replica_key:
        headers.append((b"authorization", b"Bearer " + replica.replica_key.encode()))
    base = replica.base_url.rstrip("/")
    with trio.move_on_after(10):
        try:
            prompt = await _post_json(pool, base + "/apply-template", headers, fields)
            if not isinstance(prompt, Mapping) or not isinstance(prompt.get("prompt"), str):
                return None
            counted = await _post_json(pool, base + "/tokenize", headers,
                                       {"content": prompt["prompt"], "add_special": True, "parse_special": True})
        except UpstreamFailure:
            return None
        if isinstance(counted, Mapping) and isinstance(counted.get("tokens"), list):
            return len(counted["tokens"])
    return None


async def _post_json(pool, url: str, headers, body: Mapping[str, Any]) -> Any:
    response = await pool.request("POST", url, headers, json.dumps(body, separators=(",", ":")).encode())
    try:
        raw = await response.read()
    finally:
        await response.aclose()
    if response.status != 200:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


class ResponsesRelay:
    """The relay `Gateway._run` uses for a `/v1/responses` request: the engine's chat answer in Responses' shape.
    `api`: the endpoints (for `save`); `body`: the Responses request; `items`: the turn's whole context."""

    def __init__(self, api: ResponsesApi, body: dict, items: list[dict]):
        self.api, self.body, self.items = api, body, items
        self.response_id = new_id("resp")
        self.created_at = time.time()
        self.store = body.get("store") is not False
        self._events: ResponseEvents | None = None  # a stream's, once it started

    async def whole(self, ctx: RequestContext, response, send, ledger: Ledger, headers, before_send) -> None:
        """A non-streamed answer: the Response object (stored first), or the engine's refusal as chat's."""
        if response.status != 200:
            await relay_whole(ctx, response, send, ledger, headers, before_send)
            return
        raw = await response.read()
        ledger.status = 200
        try:
            chat = json.loads(raw)
            choice = chat["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            ledger.status = 502
            raise ApiError(502, f"The engine for model '{ctx.route.name}' sent an answer that is not a chat "
                           "completion; try again.", "server_error", "upstream_error") from None
        usage = chat.get("usage") if isinstance(chat.get("usage"), dict) else None
        if usage is not None:
            ledger.prompt_tokens, ledger.completion_tokens, ledger.cached_tokens = usage_numbers(usage)
        body = {**self.body, "model": ctx.requested}
        answer = response_object(self.response_id, self.created_at, body, output_items(choice.get("message") or {}),
                                 response_usage(*usage_numbers(usage)) if usage else None,
                                 choice.get("finish_reason") or "stop")
        if self.store:
            await self.api.save(ctx, self.items, answer)
        await before_send()
        await send_json(send, 200, answer, headers)
        ledger.started_response = True

    async def stream(self, ctx: RequestContext, response, send, ledger: Ledger, headers, before_end) -> None:
        """A streamed answer as Responses events; the response is stored before response.completed goes out."""
        if response.status != 200 or not (response.header(b"content-type") or b"").startswith(EVENT_STREAM):
            await self.whole(ctx, response, send, ledger, headers, before_end)
            return
        events = self._events = ResponseEvents(self.response_id, self.created_at, {**self.body, "model": ctx.requested})
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"), *headers]})
        ledger.started_response = True
        ledger.status = 200
        await send({"type": "http.response.body", "body": events.start(), "more_body": True})
        reader = ChatChunks()
        try:
            async for data in response.body():
                out = b"".join(self._take(chunk, events, ledger, ctx) for chunk in reader.feed(data))
                if reader.error is not None:
                    raise UpstreamFailure(str(reader.error.get("message", "an error event")))
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
        except UpstreamFailure as exc:
            ledger.status = exc.status
            await before_end()
            await send({"type": "http.response.body", "more_body": False,
                        "body": events.failed(f"The engine failed mid-stream: {exc}")})
            return
        usage = None
        if ledger.prompt_tokens is not None:
            usage = response_usage(ledger.prompt_tokens, ledger.completion_tokens or 0, ledger.cached_tokens)
        tail, answer = events.finish(usage)
        if self.store:
            await self.api.save(ctx, self.items, answer)
        await before_end()
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    def cut_event(self, message: str) -> bytes:
        """The end of a stream the drain cut: response.failed."""
        return self._events.failed(message) if self._events is not None else b""

    @staticmethod
    def _take(chunk: dict, events: ResponseEvents, ledger: Ledger, ctx: RequestContext) -> bytes:
        """One chat chunk: its usage into `ledger`, a content chunk counted (and the first one's time), its
        events returned."""
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            ledger.prompt_tokens, ledger.completion_tokens, ledger.cached_tokens = usage_numbers(usage)
        out = events.chunk(chunk)
        if out:
            ledger.counted_chunks += 1
            if ledger.ttft_seconds is None:
                ledger.ttft_seconds = max(0.0, time.perf_counter() - ctx.caller.started)
        return out


class ChatChunks:
    """The JSON chunks of a chat event stream, from bytes as they arrive (frames split across reads are kept until
    complete). `error`: the engine's error event, once one came."""

    def __init__(self) -> None:
        self._buffer = b""
        self.error: dict | None = None

    def feed(self, data: bytes) -> list[dict]:
        """The complete chunks `data` finishes (`data: [DONE]` and non-JSON lines skipped)."""
        self._buffer += data.replace(b"\r\n", b"\n")
        *events, self._buffer = self._buffer.split(b"\n\n")
        chunks = []
        for event in events:
            payload = b"\n".join(line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:"))
            if not payload or payload.strip() == b"[DONE]":
                continue
            try:
                chunk = json.loads(payload)
            except ValueError:
                continue
            if isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk:
                self.error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            elif isinstance(chunk, dict):
                chunks.append(chunk)
        return chunks

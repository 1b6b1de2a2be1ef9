"""Relaying an engine's own Responses or Messages answer (`native`): the relay `Gateway._run` takes for them.

A relay has `whole` and `stream` with `proxying.relay_whole`'s arguments. Whole: a 200 answer is parsed, its usage
taken into the request's `Ledger`, its id and model made the gateway's (`native.native_response`,
`native.native_message`), stored (Responses, unless `store: false`) and sent after the settlement; any other answer
is relayed as chat's are (`proxying.relay_whole`: an engine's 4xx with its status and words, OpenAI's error shape,
which `anthropic_stream.MessagesSend` says in Anthropic's). Stream: each event is reshaped as it comes
(`native_events`), its deltas counted (the first one's time is the TTFT), the terminal event held until the
response is stored and the usage settled; an engine failure mid-stream ends the stream with the dialect's failure
event (`response.failed`, or Anthropic's `error`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from llmgw.gateway.anthropic import error_body
from llmgw.gateway.asgi import send_json
from llmgw.gateway.native import messages_usage_numbers, native_message, native_response, responses_usage_numbers
from llmgw.gateway.native_events import NativeEvents, NativeMessageEvents, NativeResponseEvents, sse_frame
from llmgw.gateway.problems import ApiError
from llmgw.gateway.proxying import EVENT_STREAM, relay_whole
from llmgw.gateway.request_context import Ledger, RequestContext
from llmgw.gateway.upstream import UpstreamFailure


class NativeRelay:
    """What the two dialects share (module docstring); a subclass says how an answer is reshaped.

    `translation`: None, or a function returning (the translated request's context, its relay or None) for when
    the engine answers 404 at its native path (a build without it): `Gateway._forward` then closes that answer and
    sends the translation to the same replica (`fall_back`); `translated` holds (that relay,) afterwards."""

    _events: NativeEvents | None = None  # a stream's, once it started
    translation: Callable[[], tuple[RequestContext, Any]] | None = None
    translated: tuple[Any] | None = None

    def fall_back(self) -> tuple[RequestContext, Any]:
        """The translated request's context and relay (see the class); remembered in `translated`."""
        assert self.translation is not None
        ctx, relay = self.translation()
        self.translated = (relay,)
        return ctx, relay

    def cut_event(self, message: str) -> bytes:
        """The end of a stream the drain cut (`Gateway._cut`): the dialect's failure event."""
        return self.failed(self._events, message) if self._events is not None else b""

    async def whole(self, ctx: RequestContext, response, send, ledger: Ledger, headers, before_send) -> None:
        if response.status != 200:
            await relay_whole(ctx, response, send, ledger, headers, before_send)
            return
        raw = await response.read()
        ledger.status = 200
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            ledger.status = 502
            raise ApiError(502, f"The engine for model '{ctx.route.name}' sent an answer that is not JSON; try "
                           "again.", "server_error", "upstream_error")
        out = await self.answer(ctx, answer, ledger)
        await before_send()
        await send_json(send, 200, out, headers)
        ledger.started_response = True

    async def stream(self, ctx: RequestContext, response, send, ledger: Ledger, headers, before_end) -> None:
        if response.status != 200 or not (response.header(b"content-type") or b"").startswith(EVENT_STREAM):
            await self.whole(ctx, response, send, ledger, headers, before_end)
            return
        events = self._events = self.events(ctx)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"), *headers]})
        ledger.started_response = True
        ledger.status = 200
        try:
            try:
                async for data in response.body():
                    out = events.feed(data)
                    self._take(events, ledger, ctx)
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
            finally:  # what came is billed, however the loop ended (a client that left too)
                self._take(events, ledger, ctx)
            out = events.finish()
        except UpstreamFailure as exc:
            ledger.status = exc.status
            await before_end()
            await send({"type": "http.response.body", "more_body": False,
                        "body": self.failed(events, f"The engine failed mid-stream: {exc}")})
            return
        self._take(events, ledger, ctx)
        if events.error is not None:
            ledger.status = 502
        if events.terminal is None and events.error is None:
            ledger.status = 502
            out += self.failed(events, "The engine's stream ended before its last event.")
        else:
            await self.finished(ctx, events)
            out += events.terminal or b""
        await before_end()
        await send({"type": "http.response.body", "body": out, "more_body": False})

    @staticmethod
    def _take(events: NativeEvents, ledger: Ledger, ctx: RequestContext) -> None:
        if events.counted and ledger.ttft_seconds is None:
            ledger.ttft_seconds = max(0.0, time.perf_counter() - ctx.caller.started)
        ledger.counted_chunks = events.counted
        if events.prompt_tokens is not None:
            ledger.prompt_tokens, ledger.cached_tokens = events.prompt_tokens, events.cached_tokens
        if events.completion_tokens is not None:
            ledger.completion_tokens = events.completion_tokens

    def events(self, ctx: RequestContext) -> NativeEvents:
        raise NotImplementedError

    async def answer(self, ctx: RequestContext, answer: dict[str, Any], ledger: Ledger) -> dict[str, Any]:
        raise NotImplementedError

    async def finished(self, ctx: RequestContext, events) -> None:
        """Called once a stream's terminal event came, before it goes out."""

    def failed(self, events, message: str) -> bytes:
        raise NotImplementedError


class NativeResponsesRelay(NativeRelay):
    """An engine's own `/v1/responses` answer. `api`: the endpoints (`responses.ResponsesApi`, for `save`);
    `body`: the client's request; `items`: the turn's whole context (stored with the response)."""

    def __init__(self, api, body: dict, items: list[dict], response_id: str,
                 translation: Callable[[], tuple[RequestContext, Any]] | None = None):
        self.api, self.body, self.items, self.response_id = api, body, items, response_id
        self.translation = translation
        self.created_at = time.time()
        self.store = body.get("store") is not False

    def _body(self, ctx: RequestContext) -> dict:
        return {**self.body, "model": ctx.requested}

    def events(self, ctx: RequestContext) -> NativeResponseEvents:
        return NativeResponseEvents(self.response_id, self.created_at, self._body(ctx))

    async def answer(self, ctx: RequestContext, answer: dict[str, Any], ledger: Ledger) -> dict[str, Any]:
        usage = answer.get("usage")
        if isinstance(usage, dict):
            ledger.prompt_tokens, ledger.completion_tokens, ledger.cached_tokens = responses_usage_numbers(usage)
        out = native_response(answer, self.response_id, self.created_at, self._body(ctx))
        if self.store:
            await self.api.save(ctx, self.items, out)
        return out

    async def finished(self, ctx: RequestContext, events) -> None:
        if self.store and events.final is not None and events.final.get("status") != "failed":
            await self.api.save(ctx, self.items, events.final)

    def failed(self, events, message: str) -> bytes:
        response = native_response({"status": "failed", "output": [], "error": {
            "code": "server_error", "message": message}}, self.response_id, self.created_at, events.body)
        return sse_frame("response.failed", {"type": "response.failed", "sequence_number": events.sequence,
                                             "response": response})


class NativeMessagesRelay(NativeRelay):
    """An engine's own `/v1/messages` answer, sent through `anthropic_stream.MessagesSend(convert=False)` (its
    refusals in Anthropic's shape). `message_id`: the answer's id; `model`: the client's name for the model."""

    def __init__(self, message_id: str, model: str,
                 translation: Callable[[], tuple[RequestContext, Any]] | None = None):
        self.message_id, self.model, self.translation = message_id, model, translation

    def events(self, ctx: RequestContext) -> NativeMessageEvents:
        return NativeMessageEvents(self.message_id, self.model)

    async def answer(self, ctx: RequestContext, answer: dict[str, Any], ledger: Ledger) -> dict[str, Any]:
        usage = answer.get("usage")
        if isinstance(usage, dict):
            prompt, completion, cached = messages_usage_numbers(usage)
            ledger.prompt_tokens, ledger.completion_tokens, ledger.cached_tokens = prompt or 0, completion or 0, cached
        return native_message(answer, self.message_id, self.model)

    def failed(self, events, message: str) -> bytes:
        return sse_frame("error", json.loads(error_body(502, message)))

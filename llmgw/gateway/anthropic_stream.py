"""The chat relay's output said in Anthropic's Messages dialect: `MessagesSend` wraps the ASGI `send` of a request
that came in as `/v1/messages` (or count_tokens), so the gateway's chat path (`proxying.relay_stream`,
`relay_whole`, refusals) runs unchanged and the client reads Anthropic's shapes.

- A whole answer (any content type but an event stream) is held until its body is complete: a 200 chat completion
  becomes a Message (`anthropic.from_chat`; with `convert=False`, count_tokens, it passes as it is), an error
  (status >= 400, OpenAI's shape) becomes Anthropic's error object with the same status.
- A stream: the relay's chunks (`data: {chat.completion.chunk}` frames, `"usage": null` on each, then the usage
  chunk and `[DONE]`; the gateway always asks for usage) become Anthropic's events, each sent as the chunk comes:
  `message_start` (usage.input_tokens 0: the engine's count comes at the end) and one `ping`, then per block
  `content_block_start` / `content_block_delta` (`text_delta`; `input_json_delta` for a tool call's arguments) /
  `content_block_stop`, then at `[DONE]` `message_delta` (stop_reason; usage with output_tokens and the prompt's
  input_tokens) and `message_stop`. An error chunk (`data: {"error": ...}`, an engine that failed mid-stream or the
  drain's cut) becomes an `error` event and ends the stream. A stream whose engine never sent `[DONE]` still ends
  with message_delta and message_stop.
Source: https://docs.anthropic.com/en/docs/build-with-claude/streaming.
"""

from __future__ import annotations

import json
from typing import Any

from llmgw.gateway.anthropic import STOP_REASONS, anthropic_usage, error_body, from_chat, openai_error_message

EVENT_STREAM = b"text/event-stream"


def event(name: str, payload: dict) -> bytes:
    """One server-sent event as Anthropic frames them (`event:` line, `data:` line)."""
    return b"event: " + name.encode() + b"\ndata: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class MessagesEvents:
    """Turns one chat stream's frames into Messages events. `feed(frames)` returns the events to send now;
    `finish()` what the end owes (message_delta and message_stop, unless sent or the stream ended in an error)."""

    def __init__(self, message_id: str, model: str):
        self.message_id, self.model = message_id, model
        self.started = self.stopped = False
        self._index = -1  # the open block's index (-1: none yet)
        self._open: str | None = None  # "text", or "tool:<chat index>"
        self._tool_id: str | None = None  # the open tool call's id
        self._stop_reason = "end_turn"
        self._usage: dict[str, Any] = {}
        self._buffer = b""

    def feed(self, data: bytes) -> bytes:
        """Events for the complete frames in `data` (a frame split across calls waits for its end)."""
        self._buffer += data
        *frames, self._buffer = self._buffer.split(b"\n\n")
        out: list[bytes] = []
        for frame in frames:
            payload = b"\n".join(line[5:].lstrip(b" ") for line in frame.split(b"\n") if line.startswith(b"data:"))
            if payload and not self.stopped:
                out.append(self._payload(payload))
        return b"".join(out)

    def finish(self) -> bytes:
        """The closing events owed when the relay's body ended."""
        if self.stopped:
            return b""
        return self._start() + self._end()

    def _start(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        message = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": anthropic_usage(0, 0, 0)}
        return event("message_start", {"type": "message_start", "message": message}) + \
            event("ping", {"type": "ping"})

    def _payload(self, payload: bytes) -> bytes:
        if payload.strip() == b"[DONE]":
            return self._start() + self._end()
        try:
            chunk = json.loads(payload)
        except ValueError:
            return b""
        if not isinstance(chunk, dict):
            return b""
        if "error" in chunk and "choices" not in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            self.stopped = True
            body = json.loads(error_body(502, str(error.get("message") or "The engine failed mid-stream.")))
            return self._start() + event("error", body)
        out = self._start()
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # Messages has one answer; n > 1 is never asked
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                out += self._block("text", {"type": "text", "text": ""})
                out += event("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                     "delta": {"type": "text_delta", "text": text}})
            for call in delta.get("tool_calls") or ():
                out += self._tool_delta(call)
            if choice.get("finish_reason"):
                self._stop_reason = STOP_REASONS.get(choice["finish_reason"], "end_turn")
        return out

    def _tool_delta(self, call: dict) -> bytes:
        function = call.get("function") or {}
        key = f"tool:{call.get('index', 0)}"
        out = b""
        if self._open != key or call.get("id") not in (None, self._tool_id):  # another call
            self._tool_id = call.get("id") or f"toolu_{self._index + 1}"
            out += self._block(key, {"type": "tool_use", "id": self._tool_id,
                                     "name": function.get("name") or "", "input": {}}, new=True)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            out += event("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                 "delta": {"type": "input_json_delta", "partial_json": arguments}})
        return out

    def _block(self, key: str, block: dict, new: bool = False) -> bytes:
        """Open a block for `key` (closing the open one) unless it is the open one and `new` is False."""
        if self._open == key and not new:
            return b""
        out = self._close()
        self._index += 1
        self._open = key
        return out + event("content_block_start", {"type": "content_block_start", "index": self._index,
                                                   "content_block": block})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return event("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _end(self) -> bytes:
        self.stopped = True
        usage = self._usage
        details = usage.get("prompt_tokens_details") or {}
        numbers = anthropic_usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                                  int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0)
        return self._close() + event("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": self._stop_reason, "stop_sequence": None},
            "usage": numbers}) + event("message_stop", {"type": "message_stop"})


class MessagesSend:
    """An ASGI `send` that says what the chat path sends in Anthropic's dialect (module docstring).

    `send`: the client's. `message_id`, `model`: the answer's id and the model name the client used.
    `convert`: translate a 200 chat completion into a Message and a chat stream into Anthropic's events (False: pass
    200 answers and event streams as they are: count_tokens, and an engine's own `/v1/messages`).
    """

    def __init__(self, send, message_id: str, model: str, *, convert: bool = True):
        self._send, self.message_id, self.model, self.convert = send, message_id, model, convert
        self._start: dict | None = None
        self._parts: list[bytes] = []
        self._events: MessagesEvents | None = None
        self._send_as_is = False

    async def __call__(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            content_type = dict(message.get("headers") or ()).get(b"content-type", b"")
            if message["status"] == 200 and content_type.startswith(EVENT_STREAM):
                if self.convert:
                    self._events = MessagesEvents(self.message_id, self.model)
                else:  # already Anthropic's events (an engine's own /v1/messages): they pass as they are
                    self._send_as_is = True
                await self._send(message)
            else:
                self._start = message
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        more = message.get("more_body", False)
        if self._send_as_is:
            await self._send(message)
            return
        if self._events is not None:
            out = self._events.feed(message.get("body", b""))
            if not more:
                out += self._events.finish()
            if out or not more:
                await self._send({"type": "http.response.body", "body": out, "more_body": more})
            return
        self._parts.append(message.get("body", b""))
        if not more:
            await self._whole(b"".join(self._parts))

    async def _whole(self, body: bytes) -> None:
        start = self._start or {"status": 502, "headers": []}
        status = start["status"]
        if status >= 400:
            body = error_body(status, openai_error_message(body))
        elif status == 200 and self.convert:
            try:
                answer = json.loads(body)
            except ValueError:
                answer = None
            body = (json.dumps(from_chat(answer, self.message_id, self.model)).encode() if isinstance(answer, dict)
                    else error_body(502, "The engine's answer was not JSON."))
        headers = [(name, value) for name, value in start.get("headers") or ()
                   if name not in (b"content-length", b"content-type")]
        await self._send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

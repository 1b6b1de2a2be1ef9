"""An engine's own Responses or Messages event stream as the client gets it: pure, one object per streamed answer.

`feed(data)` takes bytes as they arrive (an SSE frame split across reads waits for its end) and returns the frames
to send now; what each stream learns is kept in named fields for the relay (`native_relay`): `prompt_tokens`,
`completion_tokens`, `cached_tokens` (None: not told yet), `counted` (content deltas so far: what a client that
leaves is billed when the usage never came) and `first_delta` (whether one came in the last `feed`). The terminal
event is held back (`terminal`): the relay settles the usage (and stores the response) before it goes out.

Responses (`NativeResponseEvents`), shapes from llama-server b11434 (seen on loopback) and vLLM 0.32
(vllm/entrypoints/openai/responses/streaming_events.py, openai's `ResponseStreamEvent` types):
- each event's `sequence_number` is the gateway's own count from 0; an event's `response` object becomes the
  gateway's frame (`native.native_response`: its id, the client's model); an item event without `output_index`
  (llama-server sends none) gets the index of its item (counted from `response.output_item.added`), and a part
  event without `content_index` gets 0 (llama-server sends one part per message);
- deltas (`*.delta` events) are counted; `response.completed`, `response.incomplete` and `response.failed` are
  terminal: their usage is the stream's, their `response` the one stored (`final`; a failed one sets `error`).
Messages (`NativeMessageEvents`), shapes from llama-server b11434 (seen) and vLLM 0.32
(vllm/entrypoints/anthropic/serving.py `message_stream_converter`): `message_start`'s message gets the gateway's id
and the client's model; usage comes from `message_start` (input tokens; its output_tokens, 0, is not taken) and
`message_delta` (output tokens; vLLM repeats the input tokens there); `content_block_delta` events are counted; `message_stop` is terminal.
An `error` event from the engine passes as it is and sets `error`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from llmgw.gateway.native import messages_usage_numbers, native_response, responses_usage_numbers


def sse_frame(name: str, payload: Mapping[str, Any]) -> bytes:
    """One SSE frame: `event:` line, one compact JSON `data:` line."""
    return (b"event: " + name.encode() + b"\ndata: "
            + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n")


class NativeEvents:
    """What both dialects share: SSE framing, the learnt usage and counts (module docstring)."""

    TERMINAL: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens = 0
        self.counted = 0
        self.terminal: bytes | None = None
        self.error: dict | None = None
        self._buffer = b""

    def feed(self, data: bytes) -> bytes:
        """The frames to send for the complete events `data` finishes (terminal ones held in `terminal`)."""
        self._buffer += data.replace(b"\r\n", b"\n") if b"\r" in data else data
        *events, self._buffer = self._buffer.split(b"\n\n")
        return b"".join(self._event(event) for event in events)

    def finish(self) -> bytes:
        """What remains once the engine's body ended: an unterminated last event."""
        tail, self._buffer = self._buffer, b""
        return self._event(tail) if tail.strip() else b""

    def _event(self, raw: bytes) -> bytes:
        name, data = "", []
        for line in raw.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode("utf-8", "replace")
            elif line.startswith(b"data:"):
                data.append(line[5:].lstrip(b" "))
        try:
            payload = json.loads(b"\n".join(data)) if data else None
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            return raw + b"\n\n" if raw.strip() else b""
        name = payload.get("type") if isinstance(payload.get("type"), str) else name
        if name == "error":
            self.error = payload.get("error") if isinstance(payload.get("error"), dict) else payload
        shaped = self.reshape(name, payload)
        name = shaped["type"] if isinstance(shaped.get("type"), str) else name  # a reshape may rename the event
        out = sse_frame(name, shaped)
        if name in self.TERMINAL:
            self.terminal = out
            return b""
        return out

    def reshape(self, name: str, payload: dict) -> dict:
        """The event's payload as the client gets it; its usage and counts taken."""
        raise NotImplementedError


class NativeResponseEvents(NativeEvents):
    """An engine's Responses stream (module docstring). `response_id`, `created_at` (epoch seconds) and the
    client's `body` (its model name) make the gateway's Response frames; `final`: the terminal event's frame;
    `sequence`: the next event's sequence_number."""

    TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})

    def __init__(self, response_id: str, created_at: float, body: Mapping[str, Any]):
        super().__init__()
        self.response_id, self.created_at, self.body = response_id, created_at, body
        self.final: dict[str, Any] | None = None
        self.sequence = 0
        self._items: dict[str, int] = {}  # item id -> output index
        self._next_index = 0

    def reshape(self, name: str, payload: dict) -> dict:
        payload["sequence_number"] = self.sequence
        self.sequence += 1
        response = payload.get("response")
        if isinstance(response, Mapping):
            usage = response.get("usage")
            if isinstance(usage, Mapping):
                self.prompt_tokens, self.completion_tokens, self.cached_tokens = responses_usage_numbers(usage)
            frame = native_response(response, self.response_id, self.created_at, self.body)
            if name in self.TERMINAL:
                self.final = frame
                if name == "response.completed" and frame["status"] == "incomplete":  # cut at max_output_tokens
                    payload["type"] = "response.incomplete"
                if name == "response.failed":  # the engine's own failure: the request's status is 502
                    self.error = frame.get("error") or {"message": "The engine failed the response."}
            else:  # the engine's interim objects say in_progress, with no output yet
                frame["status"] = response.get("status") or "in_progress"
            payload["response"] = frame
        item = payload.get("item")
        item_id = item.get("id") if isinstance(item, Mapping) else payload.get("item_id")
        if "output_index" not in payload and (isinstance(item, Mapping) or item_id is not None):
            if name == "response.output_item.added" or item_id not in self._items:
                self._items[item_id] = self._next_index
                self._next_index += 1
            payload["output_index"] = self._items[item_id]
        elif isinstance(payload.get("output_index"), int) and item_id is not None:
            self._items[item_id] = payload["output_index"]
            self._next_index = max(self._next_index, payload["output_index"] + 1)
        if "content_index" not in payload and ("part" in payload or name.startswith("response.output_text.")):
            payload["content_index"] = 0
        if name.endswith(".delta") and payload.get("delta"):
            self.counted += 1
        return payload


class NativeMessageEvents(NativeEvents):
    """An engine's Messages stream (module docstring): `message_id` and the client's `model` replace the engine's."""

    TERMINAL = frozenset({"message_stop"})

    def __init__(self, message_id: str, model: str):
        super().__init__()
        self.message_id, self.model = message_id, model

    def reshape(self, name: str, payload: dict) -> dict:
        message = payload.get("message")
        if name == "message_start" and isinstance(message, dict):
            payload["message"] = {**message, "id": self.message_id, "model": self.model}
            self._usage(message.get("usage"), final=False)
        elif name == "message_delta":
            self._usage(payload.get("usage"), final=True)
        elif name == "content_block_delta":
            self.counted += 1
        return payload

    def _usage(self, usage: Any, final: bool) -> None:
        """Take a usage object's prompt; its output tokens only when `final` (message_start says 0 output tokens:
        taken, they would bill 0 for a stream cut before message_delta instead of the deltas counted)."""
        if not isinstance(usage, Mapping):
            return
        prompt, completion, cached = messages_usage_numbers(usage)
        if prompt is not None:
            self.prompt_tokens, self.cached_tokens = prompt, cached
        if completion is not None and final:
            self.completion_tokens = completion

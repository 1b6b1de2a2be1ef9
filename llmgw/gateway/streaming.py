"""Relaying an engine's server-sent events to the client, with the usage chunk shaped as OpenAI shapes it.

The gateway always asks the engine for usage (`stream_options.include_usage`). What the client then sees:
- it asked for usage: every chunk carries `"usage": null` except one final chunk with `choices: []` and the usage;
- it did not: no chunk carries usage (the usage-only chunk is dropped; a `usage` on a chunk with choices is removed).
llama-server variants (shared/FORMATS.md, llama.cpp tools/server/server-task.cpp): b11434 chat streams send the
usage-only chunk when asked; completion streams and older builds put `usage` (and `timings`) on the finish chunk
whose choices are not empty. Both are handled: a usage-only chunk is synthesised from such a finish chunk.

SSE frames may arrive split across reads or several per read: bytes are buffered up to the blank line. Each event is
relayed as soon as it is complete (no buffering beyond one event), except the closing `data: [DONE]`, which
the caller sends after the usage is committed (`usage.done` says it arrived). Completion tokens are counted from the chunks
(one per chunk carrying content, text or tool-call deltas) so a client that leaves mid-stream is billed for what was
generated; the engine's own usage replaces the count when it arrives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass
class StreamUsage:
    """What a stream has told so far: token counts (engine's when known, else counted) and whether it ended."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    counted_chunks: int = 0
    first_token_at: float | None = None
    done: bool = False
    error: dict | None = None


def usage_numbers(usage: dict) -> tuple[int, int, int]:
    """(prompt, completion, cached) tokens from an OpenAI usage object; missing fields are 0."""
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0), int(cached or 0)


class SseRelay:
    """Reshape one stream's events. `feed(data, now)` returns the bytes to send now; `finish()` what remains.

    `client_model`/`upstream_model`: when both are set and differ, `"model":"<upstream>"` is written back as the
    client's name in every chunk.
    """

    def __init__(self, include_usage: bool, *, client_model: str | None = None, upstream_model: str | None = None):
        self.include_usage = include_usage
        self.usage = StreamUsage()
        self._buffer = b""
        self._usage_sent = False
        self._pending_usage: dict | None = None
        self._template: dict | None = None
        self._model_swap: tuple[bytes, bytes] | None = None
        if client_model and upstream_model and client_model != upstream_model:
            self._model_swap = (b'"model":' + json.dumps(upstream_model).encode(),
                                b'"model":' + json.dumps(client_model).encode())
            self._model_swap_spaced = (b'"model": ' + json.dumps(upstream_model).encode(),
                                       b'"model": ' + json.dumps(client_model).encode())

    def feed(self, data: bytes, now: float) -> bytes:
        """Take bytes from the engine; return complete, reshaped events (possibly b"")."""
        self._buffer += data
        if b"\n\n" not in self._buffer and b"\r\n\r\n" not in self._buffer:
            return b""
        if b"\r\n" in self._buffer:
            self._buffer = self._buffer.replace(b"\r\n", b"\n")
        *events, self._buffer = self._buffer.split(b"\n\n")
        out = []
        for event in events:
            reshaped = self._event(event, now)
            if reshaped:
                out.append(reshaped)
        return b"".join(out)

    def finish(self) -> bytes:
        """Bytes to send when the engine's stream ended: a synthesised usage chunk if one is owed."""
        tail = b""
        if self._buffer.strip():
            tail = self.feed(b"\n\n", self.usage.first_token_at or 0.0)
        if not self.usage.done:
            tail += self._owed_usage()
        return tail

    def _owed_usage(self) -> bytes:
        if not self.include_usage or self._usage_sent or self._pending_usage is None:
            return b""
        self._usage_sent = True
        chunk = dict(self._template or {})
        chunk.pop("timings", None)
        chunk["choices"] = []
        chunk["usage"] = self._pending_usage
        return _frame(json.dumps(chunk, separators=(",", ":")).encode())

    def _event(self, event: bytes, now: float) -> bytes:
        data_lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
        if not data_lines:
            return event + b"\n\n" if event.strip() else b""
        payload = b"\n".join(data_lines)
        if payload.strip() == b"[DONE]":
            self.usage.done = True  # the caller sends [DONE] itself, after the usage is recorded
            return self._owed_usage()
        if self._model_swap is not None:
            payload = payload.replace(*self._model_swap).replace(*self._model_swap_spaced)
        if b'"usage"' not in payload and b'"error"' not in payload:
            self._count(payload, now)
            if self.include_usage and payload.endswith(b"}"):
                payload = payload[:-1] + b',"usage":null}'
            return _frame(payload)
        try:
            chunk = json.loads(payload)
        except ValueError:
            return _frame(payload)
        if not isinstance(chunk, dict):
            return _frame(payload)
        if "error" in chunk and "choices" not in chunk:
            self.usage.error = chunk.get("error") if isinstance(chunk.get("error"), dict) else {"message": str(chunk)}
            return _frame(payload)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            prompt, completion, cached = usage_numbers(usage)
            self.usage.prompt_tokens, self.usage.completion_tokens, self.usage.cached_tokens = prompt, completion, cached
            self._pending_usage = usage
        choices = chunk.get("choices")
        if not choices:
            if not self.include_usage or usage is None:
                return b""
            self._usage_sent = True
            chunk.pop("timings", None)
            return _frame(json.dumps(chunk, separators=(",", ":")).encode())
        self._count(payload, now)
        self._template = {k: v for k, v in chunk.items() if k not in ("choices", "usage", "timings")}
        if self.include_usage:
            chunk["usage"] = None
        else:
            chunk.pop("usage", None)
        return _frame(json.dumps(chunk, separators=(",", ":")).encode())

    def _count(self, payload: bytes, now: float) -> None:
        if b'"content":"' in payload or b'"text":"' in payload or b'"tool_calls"' in payload \
                or b'"content": "' in payload or b'"text": "' in payload:
            if b'"content":""' in payload and b'"tool_calls"' not in payload and b'"text":"' not in payload:
                return
            self.usage.counted_chunks += 1
            if self.usage.first_token_at is None:
                self.usage.first_token_at = now


def _frame(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def error_event(message: str, error_type: str = "server_error", code: str | None = None) -> bytes:
    """An OpenAI-style mid-stream error event (`data: {"error": {...}}`), which the SDK raises as APIError."""
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return _frame(json.dumps(body).encode())

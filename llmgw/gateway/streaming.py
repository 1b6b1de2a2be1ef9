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

Tool-call deltas without `index` get one (`tool_call_indices`); only chunks containing `"tool_calls"` are parsed
for that, and rewritten only when an index was missing.

Per chunk, byte markers are looked up with `bytes.find`, not `in`: CPython 3.11's `bytes.__contains__` first tries the
operand as an integer and formats, raises and clears a TypeError before searching (about 1,900 instructions of the
~140,000 a relayed chunk costs, five times per chunk: callgrind, bench/relay_instructions.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from llmgw.gateway.tool_call_indices import ToolCallIndexer


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
    """(prompt, completion, cached) tokens from an OpenAI usage object; missing fields are 0. A usage with neither
    prompt nor completion tokens (vLLM's rerank and score answers) counts its `total_tokens` as prompt tokens."""
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    prompt = usage.get("prompt_tokens")
    if prompt is None and "completion_tokens" not in usage:
        prompt = usage.get("total_tokens")
    return int(prompt or 0), int(usage.get("completion_tokens") or 0), int(cached or 0)


class SseRelay:
    """Reshape one stream's events. `feed(data, now)` returns the bytes to send now; `finish()` what remains.

    `client_model`: the name the client asked for; the engine's name for the model (`upstream_model`, or learnt
    from the first chunk) is written back as the client's in every chunk.
    """

    def __init__(self, include_usage: bool, *, client_model: str | None = None, upstream_model: str | None = None):
        self.include_usage = include_usage
        self.usage = StreamUsage()
        self._buffer = b""
        self._usage_sent = False
        self._usage_chunks: list[dict] = []
        self._finish_usages: list[dict] = []
        self._template: dict | None = None
        self._client_model = client_model
        self._model_swap: tuple[bytes, bytes] | None = None
        self._model_known = client_model is None
        self._tool_calls = ToolCallIndexer()
        if upstream_model is not None:
            self._learn_model(upstream_model)

    def _learn_model(self, upstream_model: str) -> None:
        # engines name the model their own way (llama-server: the GGUF path); the client sees its own name
        self._model_known = True
        if self._client_model and upstream_model != self._client_model:
            self._model_swap = (b'"model":' + json.dumps(upstream_model).encode(),
                                b'"model":' + json.dumps(self._client_model).encode())
            self._model_swap_spaced = (b'"model": ' + json.dumps(upstream_model).encode(),
                                       b'"model": ' + json.dumps(self._client_model).encode())

    def feed(self, data: bytes, now: float) -> bytes:
        """Take bytes from the engine; return complete, reshaped events (possibly b"")."""
        if not self._buffer and data.startswith(b"data:") and data.endswith(b"\n\n") and data.find(b"\r") < 0:
            if data.count(b"\n") == 2:  # the usual read: exactly one one-line event
                return self._payload(data[5:-2].lstrip(b" "), now, data)
            events = data[:-2].split(b"\n\n")
            if all(event.startswith(b"data:") and event.find(b"\n") < 0 for event in events):
                # several one-line events read together
                return b"".join([self._payload(event[5:].lstrip(b" "), now) for event in events])
        self._buffer += data
        if self._buffer.find(b"\n\n") < 0 and self._buffer.find(b"\r\n\r\n") < 0:
            return b""
        if self._buffer.find(b"\r\n") >= 0:
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
        if not self.include_usage or self._usage_sent:
            return b""
        usage = self.merged_usage()
        if usage is None:
            return b""
        self._usage_sent = True
        chunk = dict(self._template or {})
        chunk["choices"] = []
        chunk["usage"] = usage
        return _frame(json.dumps(chunk, separators=(",", ":")).encode())

    def merged_usage(self) -> dict | None:
        """One usage object for the whole stream, or None if the engine sent none.

        llama-server (b11434) sends one usage per choice when n > 1 (on each finish chunk, or as several
        `choices: []` chunks); they are merged: prompt and cached tokens once (the largest), completion tokens
        summed. Usage-only chunks take precedence over finish-chunk usage so nothing is counted twice.
        """
        parts = self._usage_chunks or self._finish_usages
        if not parts:
            return None
        numbers = [usage_numbers(u) for u in parts]
        prompt = max(n[0] for n in numbers)
        completion = sum(n[1] for n in numbers)
        cached = max(n[2] for n in numbers)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def _take_usage(self, usage: dict, usage_only: bool) -> None:
        (self._usage_chunks if usage_only else self._finish_usages).append(usage)
        merged = self.merged_usage()
        assert merged is not None
        self.usage.prompt_tokens = merged["prompt_tokens"]
        self.usage.completion_tokens = merged["completion_tokens"]
        self.usage.cached_tokens = merged["prompt_tokens_details"]["cached_tokens"]

    def _event(self, event: bytes, now: float) -> bytes:
        data_lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
        if not data_lines:
            return event + b"\n\n" if event.strip() else b""
        return self._payload(b"\n".join(data_lines), now)

    def _payload(self, payload: bytes, now: float, event: bytes | None = None) -> bytes:
        """Reshape one event's data (its `data:` lines joined); `event`: the whole event as it came, when it was
        one `data:` line (returned as it is when nothing changes, so the bytes are not copied again)."""
        if payload.strip() == b"[DONE]":
            self.usage.done = True  # the caller sends [DONE] itself, after the usage is recorded
            return self._owed_usage()
        if not self._model_known:
            try:
                first = json.loads(payload)
            except ValueError:
                first = None
            if isinstance(first, dict) and isinstance(first.get("model"), str):
                self._learn_model(first["model"])
        if self._model_swap is not None:
            payload = payload.replace(*self._model_swap).replace(*self._model_swap_spaced)
        if payload.find(b'"usage"') < 0 and payload.find(b'"error"') < 0:  # JSON is parsed only where these can be
            if payload.find(b'"tool_calls"') >= 0:
                payload = self._indexed(payload)
                self._counted(now)
            elif _has_text(payload, b'"content":') or _has_text(payload, b'"text":'):
                self._counted(now)
            if self.include_usage and payload.endswith(b"}"):
                payload = payload[:-1] + b',"usage":null}'
            elif event is not None and self._model_swap is None and event.startswith(b"data: ") \
                    and len(event) == len(payload) + 8:
                return event
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
        choices = chunk.get("choices")
        self._tool_calls.index_chunk(chunk)
        if isinstance(usage, dict):
            self._take_usage(usage, usage_only=not choices)
        if not choices:
            if self._template is None:
                self._template = {k: v for k, v in chunk.items() if k not in ("choices", "usage", "timings")}
            return b""  # usage-only chunks are merged into one, sent at the end when the client asked
        self._count(payload, now)
        if self._template is None:
            self._template = {k: v for k, v in chunk.items() if k not in ("choices", "usage", "timings")}
        if self.include_usage:
            chunk["usage"] = None
        else:
            chunk.pop("usage", None)
        return _frame(json.dumps(chunk, separators=(",", ":")).encode())

    def _indexed(self, payload: bytes) -> bytes:
        """`payload` with an `index` on every tool-call delta (`tool_call_indices`); the same bytes when every
        delta had one (or it is not a JSON object)."""
        try:
            chunk = json.loads(payload)
        except ValueError:
            return payload
        if not isinstance(chunk, dict) or not self._tool_calls.index_chunk(chunk):
            return payload
        return json.dumps(chunk, separators=(",", ":")).encode()

    def _count(self, payload: bytes, now: float) -> None:
        if payload.find(b'"tool_calls"') >= 0 or _has_text(payload, b'"content":') or _has_text(payload, b'"text":'):
            self._counted(now)

    def _counted(self, now: float) -> None:
        """One more content chunk (text or tool-call deltas), the first one's time kept."""
        self.usage.counted_chunks += 1
        if self.usage.first_token_at is None:
            self.usage.first_token_at = now


def _has_text(payload: bytes, key: bytes) -> bool:
    """Whether `key` is followed by a non-empty string (compact or spaced JSON)."""
    at = payload.find(key)
    if at < 0:
        return False
    rest = payload[at + len(key):at + len(key) + 3].lstrip(b" ")
    return rest.startswith(b'"') and not rest.startswith(b'""')


def _frame(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def error_event(message: str, error_type: str = "server_error", code: str | None = None) -> bytes:
    """An OpenAI-style mid-stream error event (`data: {"error": {...}}`), which the SDK raises as APIError."""
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return _frame(json.dumps(body).encode())

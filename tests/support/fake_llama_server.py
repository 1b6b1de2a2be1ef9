"""An engine stand-in that answers like llama-server (llama.cpp b11434), for tests and for agents without a GPU.

Run it as llama-server would be run::

    LLAMA_API_KEY=secret python tests/support/fake_llama_server.py --host 127.0.0.1 --port 8080 \
        -m /models/gemma.gguf --alias gemma --metrics -c 2048 -t 2

Unknown llama-server flags are accepted and ignored. Or use it in process: `FakeLlamaServer(...).serve(...)`.

Shapes follow llama.cpp's tools/server (server-task.cpp, b11434) and shared/FORMATS.md:
- `/health` -> 200 {"status":"ok"}; `/v1/models` (public) -> {"object":"list","data":[...],"models":[...]}.
- Without the key (Bearer or X-Api-Key): 401 {"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}.
- Chat stream: a role chunk, one chunk per token delta, a finish chunk (non-empty choices, `timings`), then, when
  `stream_options.include_usage`, a chunk with `choices: []` and `usage` (timings move to it); then `data: [DONE]`.
- Completion stream: chunks with `text`; the finish chunk carries `usage` and `timings` with non-empty choices
  (the older behaviour FORMATS.md describes, which a proxy must also handle).
- `n` > 1: one choice per index (streams interleave the indices, and each choice ends with its own usage, as
  b11434 does); `tools` (and tool_choice not "none"): a call to the
  first tool, streamed as `tool_calls` deltas by index, finish_reason "tool_calls".
- `/metrics` with llamacpp:* names, 501 unless started with `--metrics`; its prompt and generation seconds are its
  tokens at `PROMPT_TOKENS_PER_SECOND` and `PREDICTED_TOKENS_PER_SECOND` (what a measured speed of it should say).
- `/v1/responses` and `/v1/messages`, whole and streamed, in b11434's own shapes (`fake_llama_dialects`).

`--fake-request-log PATH` appends one JSON line per completion request it takes (`{"path", "prompt"}`): the engine's
own count of the requests it ran, per prompt.

Text is deterministic: the same prompt and seed give the same words. Token counts: prompt = words of the prompt
text + 4 per message; each generated word is one token.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field

import trio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_llama_dialects import answer_dialect  # noqa: E402

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
         "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango")
BUILD_INFO = "b11434-fake"
PUBLIC_PATHS = {"/health", "/v1/health", "/models", "/v1/models"}
PROMPT_TOKENS_PER_SECOND = 1000.0
PREDICTED_TOKENS_PER_SECOND = 250.0
"""The speeds its /metrics counters say it works at (prompt and generation seconds are its tokens over these)."""


@dataclass
class FakeStats:
    """Counters a test may read: requests seen per path, prompt and predicted tokens, requests in progress."""

    requests: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    predicted_tokens: int = 0
    processing: int = 0
    bodies: list[dict] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


class FakeLlamaServer:
    """An ASGI app answering like llama-server.

    `model_path` is what `-m` named; `alias` the served name (default: the path, as llama-server does).
    `api_key` None accepts every request. `token_delay` seconds between streamed tokens. `max_tokens_default`
    when the request gives none. `fail_after_chunks`: when set, a stream's connection is dropped after that many
    token chunks (an engine crash mid-stream). `first_token_delay`: seconds a completion waits before its answer
    starts (a slow prompt processing: every request's time to first token grows by it).
    """

    def __init__(self, model_path: str = "/models/fake.gguf", alias: str | None = None, *, api_key: str | None = None,
                 metrics: bool = True, token_delay: float = 0.0, max_tokens_default: int = 16,
                 fail_after_chunks: int | None = None, context_size: int = 2048, first_token_delay: float = 0.0,
                 request_log: str | None = None):
        self.model_path = model_path
        self.alias = alias or model_path
        self.api_key = api_key
        self.metrics = metrics
        self.token_delay = token_delay
        self.max_tokens_default = max_tokens_default
        self.fail_after_chunks = fail_after_chunks
        self.context_size = context_size
        self.first_token_delay = first_token_delay
        self.request_log = request_log
        self.stats = FakeStats()
        self.healthy = True  # False: /health answers 503 "Loading model", as llama-server does while loading
        self._ids = 0

    # ---- ASGI ----
    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path = scope["path"]
        self.stats.requests[path] = self.stats.requests.get(path, 0) + 1
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if path not in PUBLIC_PATHS and self.api_key is not None:
            given = headers.get("authorization", "")
            given = given[7:] if given.lower().startswith("bearer ") else headers.get("x-api-key", "")
            if given != self.api_key:
                await _send_json(send, 401, {"error": {"code": 401, "message": "Invalid API Key",
                                                      "type": "authentication_error"}})
                return
        if path in ("/health", "/v1/health"):
            if self.healthy:
                await _send_json(send, 200, {"status": "ok"})
            else:
                await _send_json(send, 503, {"error": {"code": 503, "message": "Loading model",
                                                      "type": "unavailable_error"}})
        elif path in ("/models", "/v1/models"):
            await _send_json(send, 200, self._models())
        elif path == "/metrics":
            if not self.metrics:
                await _send_json(send, 501, {"error": {"code": 501, "message": "This server does not support metrics endpoint. Start it with `--metrics`",
                                                      "type": "not_supported_error"}})
            else:
                await _send(send, 200, self._metrics_text().encode(), "text/plain; version=0.0.4")
        elif path in ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions",
                      "/v1/embeddings", "/embeddings", "/v1/responses", "/v1/messages"):
            try:
                request = json.loads(body)
                if not isinstance(request, dict):
                    raise ValueError("not an object")
            except ValueError:
                await _send_json(send, 400, {"error": {"code": 400, "message": "Failed to parse the request body as JSON",
                                                      "type": "invalid_request_error"}})
                return
            self.stats.bodies.append(request)
            self.stats.headers.append(headers)
            if path in ("/v1/responses", "/v1/messages"):  # b11434's own dialects (fake_llama_dialects)
                await answer_dialect(self, send, path, request, _send_json)
                return
            if path.endswith("embeddings"):
                await _send_json(send, 200, self._embeddings(request))
            else:
                await self._completion(send, request, chat=path.endswith("chat/completions"))
        elif path in ("/v1/messages/count_tokens", "/v1/rerank"):  # as b11434 answers them (shapes only)
            try:
                request = json.loads(body)
                self.stats.bodies.append(request)
                if path == "/v1/rerank":
                    documents = request["documents"]
                    tokens = sum(_count_tokens(f"{request['query']} {d}") for d in documents)
                    answer = {"model": request.get("model") or self.alias, "object": "list",
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                              "results": [{"index": i, "relevance_score": float(len(d) % 7)}
                                          for i, d in enumerate(documents)]}
                else:
                    text = json.dumps(request["messages"]) + json.dumps(request.get("system") or "")
                    answer = {"input_tokens": _count_tokens(text)}
            except (ValueError, KeyError, TypeError):
                await _send_json(send, 400, {"error": {"code": 400, "message": "bad request",
                                                      "type": "invalid_request_error"}})
                return
            await _send_json(send, 200, answer)
        else:
            await _send_json(send, 404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    # ---- bodies ----
    def _models(self) -> dict:
        created = int(time.time())
        return {
            "models": [{"name": self.alias, "model": self.alias, "modified_at": "", "size": "", "digest": "",
                        "type": "model", "description": "", "tags": [""], "capabilities": ["completion"],
                        "parameters": "", "details": {"parent_model": "", "format": "gguf", "family": "",
                                                      "families": [""], "parameter_size": "", "quantization_level": ""}}],
            "object": "list",
            "data": [{"id": self.alias, "object": "model", "created": created, "owned_by": "llamacpp",
                      "meta": {"vocab_type": 1, "n_vocab": 262144, "n_ctx_train": 32768, "n_embd": 640,
                               "n_params": 268098176, "size": 253116416}}],
        }

    def _metrics_text(self) -> str:
        s = self.stats
        lines = []
        for name, kind, value, text in (
            ("prompt_tokens_total", "counter", s.prompt_tokens, "Number of prompt tokens processed."),
            ("prompt_seconds_total", "counter", s.prompt_tokens / PROMPT_TOKENS_PER_SECOND, "Prompt process time"),
            ("tokens_predicted_total", "counter", s.predicted_tokens, "Number of generation tokens processed."),
            ("tokens_predicted_seconds_total", "counter", s.predicted_tokens / PREDICTED_TOKENS_PER_SECOND,
             "Predict process time"),
            ("n_decode_total", "counter", s.predicted_tokens, "Total number of llama_decode() calls"),
            ("n_busy_slots_per_decode", "counter", 1, "Average number of busy slots per llama_decode() call"),
            ("prompt_tokens_seconds", "gauge", 0.0, "Average prompt throughput in tokens/s."),
            ("predicted_tokens_seconds", "gauge", 0.0, "Average generation throughput in tokens/s."),
            ("kv_cache_usage_ratio", "gauge", min(1.0, s.processing * 64 / self.context_size), "KV-cache usage. 1 means 100 percent usage."),
            ("kv_cache_tokens", "gauge", s.processing * 64, "KV-cache tokens."),
            ("requests_processing", "gauge", s.processing, "Number of requests processing."),
            ("requests_deferred", "gauge", 0, "Number of requests deferred."),
        ):
            lines += [f"# HELP llamacpp:{name} {text}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value}"]
        return "\n".join(lines) + "\n"

    def _embeddings(self, request: dict) -> dict:
        inputs = request.get("input", "")
        # one string, one array of token ids, or an array of either (OpenAI's four shapes)
        items = inputs if isinstance(inputs, list) and not all(isinstance(i, int) for i in inputs) else [inputs]
        data, tokens = [], 0
        for index, item in enumerate(items):
            text = item if isinstance(item, str) else " ".join(map(str, item))
            tokens += _count_tokens(text)
            digest = hashlib.sha256(text.encode()).digest()
            data.append({"embedding": [round((b - 128) / 128, 6) for b in digest[:16]], "index": index,
                         "object": "embedding"})
        self.stats.prompt_tokens += tokens
        return {"model": request.get("model", self.alias), "object": "list",
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "data": data}

    async def _completion(self, send, request: dict, *, chat: bool) -> None:
        prompt_text, prompt_tokens = _prompt_of(request, chat)
        if self.request_log:
            with open(self.request_log, "a", encoding="utf-8") as log:
                log.write(json.dumps({"path": "/v1/chat/completions" if chat else "/v1/completions",
                                      "prompt": prompt_text}) + "\n")
        max_tokens = request.get("max_tokens") or request.get("max_completion_tokens") or self.max_tokens_default
        n = int(request.get("n") or 1)
        seed = request.get("seed")
        tools = request.get("tools") if chat else None
        use_tool = bool(tools) and request.get("tool_choice") != "none"
        choices = [self._generate(prompt_text, seed, i, int(max_tokens), tools[0] if use_tool else None) for i in range(n)]
        self._ids += 1
        cmpl_id = f"chatcmpl-fake{self._ids:06d}" if chat else f"cmpl-fake{self._ids:06d}"
        model = request.get("model") or self.alias
        completion_tokens = sum(len(c["pieces"]) for c in choices)
        usage = {"completion_tokens": completion_tokens, "prompt_tokens": prompt_tokens,
                 "total_tokens": completion_tokens + prompt_tokens, "prompt_tokens_details": {"cached_tokens": 0}}
        timings = {"cache_n": 0, "prompt_n": prompt_tokens, "prompt_ms": 1.0, "prompt_per_token_ms": 0.1,
                   "prompt_per_second": 1000.0, "predicted_n": completion_tokens, "predicted_ms": 1.0,
                   "predicted_per_token_ms": 0.1, "predicted_per_second": 1000.0}
        self.stats.prompt_tokens += prompt_tokens
        self.stats.processing += 1
        try:
            if self.first_token_delay:
                await trio.sleep(self.first_token_delay)
            if request.get("stream"):
                include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
                await self._stream(send, choices, chat, cmpl_id, model, usage, timings, include_usage)
            else:
                await trio.sleep(self.token_delay * max(len(c["pieces"]) for c in choices))
                self.stats.predicted_tokens += completion_tokens
                body = {"choices": [self._final_choice(c, chat) for c in choices], "created": int(time.time()),
                        "model": model, "system_fingerprint": BUILD_INFO,
                        "object": "chat.completion" if chat else "text_completion", "usage": usage,
                        "id": cmpl_id, "timings": timings}
                await _send_json(send, 200, body)
        finally:
            self.stats.processing -= 1

    def _generate(self, prompt: str, seed, index: int, max_tokens: int, tool: dict | None) -> dict:
        digest = hashlib.sha256(f"{prompt}|{seed}|{index}".encode()).digest()
        if tool is not None:
            name = (tool.get("function") or {}).get("name", "tool")
            arguments = json.dumps({"location": WORDS[digest[0] % len(WORDS)]})
            pieces = [arguments[i:i + 4] for i in range(0, len(arguments), 4)][:max(1, max_tokens)]
            return {"index": index, "pieces": pieces, "tool": name, "call_id": digest.hex()[:24],
                    "finish": "tool_calls"}
        count = min(max_tokens, 8 + digest[1] % 8)
        pieces = [("" if i == 0 else " ") + WORDS[digest[(i + 2) % 32] % len(WORDS)] for i in range(count)]
        return {"index": index, "pieces": pieces, "tool": None, "finish": "length" if count == max_tokens else "stop"}

    def _final_choice(self, choice: dict, chat: bool) -> dict:
        text = "".join(choice["pieces"])
        if not chat:
            return {"text": text, "index": choice["index"], "logprobs": None, "finish_reason": choice["finish"]}
        message: dict = {"role": "assistant", "content": text}
        if choice["tool"]:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"type": "function", "function": {"name": choice["tool"], "arguments": text},
                 "id": choice["call_id"]}]}
        return {"finish_reason": choice["finish"], "index": choice["index"], "message": message}

    async def _stream(self, send, choices, chat, cmpl_id, model, usage, timings, include_usage) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        created = int(time.time())
        base = {"created": created, "id": cmpl_id, "model": model, "system_fingerprint": BUILD_INFO,
                "object": "chat.completion.chunk" if chat else "text_completion"}

        async def emit(chunk: dict) -> None:
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(chunk).encode() + b"\n\n",
                        "more_body": True})

        if chat:
            for c in choices:
                await emit({"choices": [{"finish_reason": None, "index": c["index"],
                                         "delta": {"role": "assistant", "content": None}}], **base})
        sent = 0
        for step in range(max(len(c["pieces"]) for c in choices)):
            for c in choices:
                if step >= len(c["pieces"]):
                    continue
                if self.fail_after_chunks is not None and sent >= self.fail_after_chunks:
                    raise trio.BrokenResourceError("fake engine crashed mid-stream")
                piece = c["pieces"][step]
                if not chat:
                    choice = {"text": piece, "index": c["index"], "logprobs": None, "finish_reason": None}
                elif c["tool"]:
                    call: dict = {"index": 0, "function": {"arguments": piece}}
                    if step == 0:
                        call = {"index": 0, "id": c["call_id"], "type": "function",
                                "function": {"name": c["tool"], "arguments": piece}}
                    choice = {"finish_reason": None, "index": c["index"], "delta": {"tool_calls": [call]}}
                else:
                    choice = {"finish_reason": None, "index": c["index"], "delta": {"content": piece}}
                await emit({"choices": [choice], **base})
                self.stats.predicted_tokens += 1
                sent += 1
            if self.token_delay:
                await trio.sleep(self.token_delay)
        for c in choices:
            # as b11434 does for n > 1 (captured): every choice ends with its own usage
            own = {"completion_tokens": len(c["pieces"]), "prompt_tokens": usage["prompt_tokens"],
                   "total_tokens": len(c["pieces"]) + usage["prompt_tokens"], "prompt_tokens_details": {"cached_tokens": 0}}
            if chat:
                chunk = {"choices": [{"finish_reason": c["finish"], "index": c["index"], "delta": {}}], **base}
                if not include_usage:
                    chunk["timings"] = timings
                await emit(chunk)
                if include_usage:
                    await emit({"choices": [], **base, "usage": own, "timings": timings})
            else:
                await emit({"choices": [{"text": "", "index": c["index"], "logprobs": None,
                                         "finish_reason": c["finish"]}], **base, "usage": own, "timings": timings})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    # ---- serving ----
    async def serve(self, host: str = "127.0.0.1", port: int = 0, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve on hypercorn's trio worker until cancelled; `task_status.started(bound_port)`."""
        from hypercorn.config import Config
        from hypercorn.trio import serve

        config = Config()
        config.bind = [f"{host}:{port}"]
        config.accesslog = None
        config.errorlog = None
        config.keep_alive_timeout = 75
        config.loglevel = "ERROR"

        async def started(task_status=trio.TASK_STATUS_IGNORED):
            await serve(self, config, task_status=task_status)

        async with trio.open_nursery() as nursery:
            binds = await nursery.start(started)
            task_status.started(int(binds[0].rsplit(":", 1)[1]))


def _count_tokens(text: str) -> int:
    return max(1, len(text.split()))


def _prompt_of(request: dict, chat: bool) -> tuple[str, int]:
    if chat:
        parts, extra = [], 0
        for message in request.get("messages") or []:
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(f"{message.get('role')}: {content or ''}")
            extra += 4
        text = "\n".join(parts)
        return text, _count_tokens(text) + extra
    prompt = request.get("prompt") or ""  # OpenAI's prompt is nullable
    text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
    return text, _count_tokens(text)


async def _send(send, status: int, body: bytes, content_type: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send, status: int, payload: dict) -> None:
    await _send(send, status, json.dumps(payload).encode(), "application/json; charset=utf-8")


def main(argv: list[str] | None = None) -> None:
    """Parse llama-server's command line (unknown flags ignored) and serve until interrupted."""
    parser = argparse.ArgumentParser(description="llama-server stand-in", add_help=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("-m", "--model", default="/models/fake.gguf")
    parser.add_argument("-a", "--alias", default=None)
    parser.add_argument("--metrics", action="store_true")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("-c", "--ctx-size", type=int, default=2048)
    parser.add_argument("--fake-token-delay", type=float, default=0.0, help="seconds between streamed tokens")
    parser.add_argument("--fake-first-token-delay", type=float, default=0.0,
                        help="seconds before a completion's answer starts")
    parser.add_argument("--fake-request-log", default=None, help="a file: one JSON line per completion request")
    args, _unknown = parser.parse_known_args(argv)
    server = FakeLlamaServer(args.model, args.alias, api_key=args.api_key or os.environ.get("LLAMA_API_KEY"),
                             metrics=args.metrics, token_delay=args.fake_token_delay, context_size=args.ctx_size,
                             first_token_delay=args.fake_first_token_delay, request_log=args.fake_request_log)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.serve, args.host, args.port)
            print(f"main: server is listening on http://{args.host}:{port} - starting the main loop", file=sys.stderr,
                  flush=True)

    try:
        trio.run(run)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

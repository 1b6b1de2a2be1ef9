"""Running `llmgw bench`'s load: streamed completions of a chosen prompt and output length at a chosen concurrency,
each request timed (`bench_stats.RequestTiming`), against an engine (through its replica key) or the gateway.

Requests go to `POST /v1/completions` (OpenAI's legacy completions, served by llama-server, vLLM, SGLang and the
gateway) with `stream: true`, `stream_options.include_usage` (the token counts in the last chunk), `max_tokens` =
the output length and `ignore_eos: true` (llama-server and vLLM both take it: every answer runs to its length), so
a run measures what it says. Each prompt starts with its request's number, so no two share a prefix in the
engine's prompt cache (the prefill is measured, not skipped). A prompt of N tokens is N common one-token words,
corrected once by a warm-up request: the engine's own `usage.prompt_tokens` for it moves the word count by the
difference (the warm-up is not timed). Format: OpenAI's streamed completions (`data: {...}` lines, `data:
[DONE]`); llama-server adds `timings` to its last chunk (tests/control/test_bench_real_llama_server.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import trio

from llmgw.control.bench_stats import RequestTiming
from llmgw.errors import UpstreamError
from llmgw.http_trust import default_verify

# Short English words that are one token each in the Gemma, Llama and SmolLM2 vocabularies (with their space).
_WORDS = ("the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "big", "red", "house", "in", "old",
          "town", "by", "sea", "with", "blue", "sky")
WARMUP_TOKENS = 1


@dataclass(frozen=True)
class BenchLoad:
    """One run. `base_url`: the engine's or the gateway's root ("http://10.0.0.5:41235", no /v1); `key`: the bearer
    key to send (the replica key, or an API key through the gateway; None: none); `model`: the model name to send.
    `prompt_tokens`, `output_tokens`: per request; `concurrency`: requests in flight at once; `requests`: in all.
    `timeout`: seconds one request may take."""

    base_url: str
    key: str | None
    model: str
    prompt_tokens: int = 128
    output_tokens: int = 64
    concurrency: int = 1
    requests: int = 8
    timeout: float = 300.0


@dataclass(frozen=True)
class BenchRun:
    """What `run_load` measured: every request's timing in the order they finished, the wall time in seconds from
    the first request sent to the last one's end, the engine build its answers named (`system_fingerprint`; ""
    when none did), the words per prompt the warm-up settled on, and the requests the engine runs at once
    (llama-server's `GET /props` `total_slots`; 0: not said, as vLLM and the gateway do not)."""

    timings: tuple[RequestTiming, ...]
    wall_seconds: float
    engine_build: str
    prompt_words: int
    slots: int = 0


def prompt_text(words: int, index: int) -> str:
    """The prompt of request `index`: its number, then `words` words (one token each in common vocabularies)."""
    body = " ".join(_WORDS[(index + i) % len(_WORDS)] for i in range(max(words, 0)))
    return f"{index}: {body}"


def _body(load: BenchLoad, prompt: str, max_tokens: int) -> dict:
    return {"model": load.model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0}


async def timed_request(client: httpx.AsyncClient, load: BenchLoad, prompt: str, max_tokens: int,
                        build: list[str]) -> RequestTiming:
    """Send one streamed completion of `prompt` (`max_tokens` tokens, `ignore_eos`) to `client` (whose base URL is
    `load.base_url`) and time it; the engine build it names goes into `build` when that is empty. An HTTP or
    transport failure is a timing with `error` set. A connection the engine closed while idle in the pool
    (llama-server's HTTP library closes one after 5 requests) fails before any answer: that request is sent once
    more on a new connection, timed from then."""
    timing = await _try(client, load, prompt, max_tokens, build)
    if timing.error.startswith(_STALE):
        timing = await _try(client, load, prompt, max_tokens, build)
    return timing


_STALE = "RemoteProtocolError: Server disconnected without sending a response"


async def _try(client: httpx.AsyncClient, load: BenchLoad, prompt: str, max_tokens: int,
               build: list[str]) -> RequestTiming:
    sent = trio.current_time()
    chunks: list[float] = []
    usage: dict = {}
    engine: dict = {}
    headers = {"Authorization": f"Bearer {load.key}"} if load.key else {}
    try:
        async with client.stream("POST", "/v1/completions", json=_body(load, prompt, max_tokens),
                                 headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")[:200]
                return RequestTiming(sent, done=trio.current_time(), error=f"HTTP {response.status_code}: {text}")
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                now = trio.current_time()
                chunk = json.loads(line[5:])
                if any(choice.get("text") for choice in chunk.get("choices") or ()):
                    chunks.append(now)
                usage = chunk.get("usage") or usage
                engine = chunk.get("timings") or engine
                if chunk.get("system_fingerprint") and not build:
                    build.append(str(chunk["system_fingerprint"]))
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return RequestTiming(sent, tuple(chunks), trio.current_time(), error=f"{type(exc).__name__}: {exc}")
    return RequestTiming(sent, tuple(chunks), trio.current_time(), int(usage.get("prompt_tokens") or 0),
                         int(usage.get("completion_tokens") or 0), engine)


async def run_load(load: BenchLoad, on_done: Callable[[RequestTiming], None] = lambda timing: None,
                   *, transport: httpx.AsyncBaseTransport | None = None) -> BenchRun:
    """Warm up once (settling the words per prompt), then send `load.requests` requests, `load.concurrency` at a
    time; `on_done(timing)` after each (a progress bar). A checkpoint; cancellable.

    Raises UpstreamError (a sentence naming the URL and the answer) when the warm-up fails: nothing is measured
    against a target that does not answer. Failures of measured requests are kept in their timings.
    """
    limits = httpx.Limits(max_connections=load.concurrency + 1, max_keepalive_connections=load.concurrency + 1)
    async with httpx.AsyncClient(base_url=load.base_url, timeout=load.timeout, limits=limits,
                                 transport=transport, verify=default_verify()) as client:
        build: list[str] = []
        words = load.prompt_tokens
        warm = await timed_request(client, load, prompt_text(words, 0), WARMUP_TOKENS, build)
        if warm.error:
            raise UpstreamError(f"{load.base_url} did not answer a warm-up completion of model {load.model!r}: "
                                f"{warm.error}")
        if warm.prompt_tokens > 0:
            words = max(1, words + load.prompt_tokens - warm.prompt_tokens)
        slots = await _slots(client, load)
        timings: list[RequestTiming] = []
        next_index = iter(range(1, load.requests + 1))

        async def worker() -> None:
            for index in next_index:
                timing = await timed_request(client, load, prompt_text(words, index), load.output_tokens, build)
                timings.append(timing)
                on_done(timing)

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(min(load.concurrency, load.requests)):
                nursery.start_soon(worker)
        wall = trio.current_time() - start
    return BenchRun(tuple(timings), wall, build[0] if build else "", words, slots)


async def _slots(client: httpx.AsyncClient, load: BenchLoad) -> int:
    """llama-server's slot count (`GET /props` `total_slots`), 0 when the target does not say (any other answer).
    Asked twice when the connection fails (one the engine closed in the pool, as for the requests)."""
    headers = {"Authorization": f"Bearer {load.key}"} if load.key else {}
    slots = None
    for _attempt in range(2):
        try:
            answer = await client.get("/props", headers=headers)
            slots = answer.json().get("total_slots") if answer.status_code == 200 else None
            break
        except httpx.TransportError:
            continue
        except (httpx.HTTPError, ValueError, AttributeError):
            return 0
    return slots if isinstance(slots, int) and not isinstance(slots, bool) and slots > 0 else 0

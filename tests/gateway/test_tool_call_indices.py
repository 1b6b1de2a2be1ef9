"""Streamed tool-call deltas without `index` (issue 39 item 2): the gateway gives each call of a choice its index.

A stand-in backend (a real HTTP server on loopback) streams two parallel tool calls per choice in separate deltas
without `index`, as several OpenAI-compatible servers do; the official Python and Node `openai` SDKs' stream
helpers, through the gateway, assemble both calls with their arguments. The Node SDK is installed (pinned,
`NODE_OPENAI`) into `$LLMGW_CACHE/node` by `make node-sdk`, or by the fixture here when it is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import openai
import pytest
import trio
from gateway_harness import make_table, read_body, replica, serve_asgi, start_gateway

from llmgw.engines.installing import default_cache_dir
from llmgw.gateway import SseRelay

NODE_OPENAI = "openai@6.49.0"
NODE_SCRIPT = Path(__file__).with_name("node") / "stream_tool_calls.cjs"
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
         for name in ("get_weather", "get_time")]
USER = [{"role": "user", "content": "weather and time in Paris?"}]
BASE = {"id": "chatcmpl-t", "object": "chat.completion.chunk", "created": 1, "model": "gemma"}


def _calls(choice: int) -> list[dict]:
    """One choice's deltas: call a starts, b starts and ends, a ends (its id repeated, as some backends repeat
    it on every delta), all without `index`."""
    a, b = f"call_{choice}_a", f"call_{choice}_b"
    return [{"role": "assistant", "content": None},
            {"tool_calls": [{"id": a, "type": "function", "function": {"name": "get_weather", "arguments": ""}}]},
            {"tool_calls": [{"function": {"arguments": '{"city": '}}]},
            {"tool_calls": [{"id": b, "type": "function", "function": {"name": "get_time", "arguments": ""}}]},
            {"tool_calls": [{"function": {"arguments": '{"tz": "CET"}'}}]},
            {"tool_calls": [{"id": a, "function": {"arguments": f'"Paris-{choice}"}}'}}]}]


def stream_events(n: int) -> list[bytes]:
    """The stand-in's whole answer for `n` choices, interleaved per step, as SSE frames."""
    steps = [_calls(choice) for choice in range(n)]
    chunks = [{**BASE, "choices": [{"index": choice, "delta": steps[choice][step], "finish_reason": None}]}
              for step in range(len(steps[0])) for choice in range(n)]
    chunks += [{**BASE, "choices": [{"index": choice, "delta": {}, "finish_reason": "tool_calls"}]} for choice in range(n)]
    chunks.append({**BASE, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 10 * n,
                                                    "total_tokens": 9 + 10 * n}})
    return [b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks] + [b"data: [DONE]\n\n"]


def expected(n: int) -> list[dict]:
    return [{"index": choice, "tool_calls": [
        {"id": f"call_{choice}_a", "name": "get_weather", "arguments": f'{{"city": "Paris-{choice}"}}'},
        {"id": f"call_{choice}_b", "name": "get_time", "arguments": '{"tz": "CET"}'}]} for choice in range(n)]


async def tool_call_engine(scope, receive, send):
    """ASGI stand-in: GET answers 200; POST streams `stream_events(n)` one frame per write."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    raw = await read_body(receive)
    if scope["method"] != "POST":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    for frame in stream_events(int(json.loads(raw).get("n") or 1)):
        await send({"type": "http.response.body", "body": frame, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


@pytest.fixture
async def gateway(nursery, store):
    port = await nursery.start(serve_asgi, tool_call_engine)
    _gateway, base = await start_gateway(nursery, store, make_table(
        {"gemma": [replica("g-1", f"http://127.0.0.1:{port}")]}))
    _key, plaintext = store.create_api_key("chat")
    return base, plaintext


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """`$LLMGW_CACHE/node/node_modules` holding the pinned Node `openai` SDK (installed with npm when missing)."""
    prefix = default_cache_dir() / "node"
    installed = prefix / "node_modules" / "openai" / "package.json"
    if not installed.exists() or json.loads(installed.read_text())["version"] != NODE_OPENAI.split("@")[1]:
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--no-save",
                        NODE_OPENAI], check=True, capture_output=True, timeout=300)
    return prefix / "node_modules"


@pytest.mark.parametrize("n", [1, 2])
async def test_python_sdk_stream_helper_assembles_both_calls(gateway, n):
    base, key = gateway
    client = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0)
    async with client.chat.completions.stream(model="gemma", messages=USER, tools=TOOLS, n=n) as stream:
        async for _event in stream:
            pass
        completion = await stream.get_final_completion()
    assert [{"index": c.index, "tool_calls": [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
                                              for t in c.message.tool_calls]}
            for c in completion.choices] == expected(n)
    assert {c.finish_reason for c in completion.choices} == {"tool_calls"}


@pytest.mark.parametrize("n", [1, 2])
async def test_node_sdk_stream_helper_assembles_both_calls(gateway, node_modules, n):
    base, key = gateway
    done = await trio.run_process(["node", str(NODE_SCRIPT), base, key, str(n)], capture_stdout=True,
                                  capture_stderr=True, check=False,
                                  env={**os.environ, "NODE_PATH": str(node_modules)})
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout) == expected(n)


async def test_the_relayed_deltas_carry_one_index_per_call_id(gateway):
    base, key = gateway
    async with httpx.AsyncClient() as client:
        answer = await client.post(f"{base}/chat/completions", headers={"authorization": f"Bearer {key}"},
                                   json={"model": "gemma", "messages": USER, "tools": TOOLS, "stream": True, "n": 2})
    chunks = [json.loads(line[6:]) for line in answer.text.split("\n\n") if line.startswith("data: {")]
    seen = [(c["choices"][0]["index"], call.get("id"), call["index"])
            for c in chunks for call in c["choices"][0]["delta"].get("tool_calls", [])]
    assert seen == [(0, "call_0_a", 0), (1, "call_1_a", 0), (0, None, 0), (1, None, 0), (0, "call_0_b", 1),
                    (1, "call_1_b", 1), (0, None, 1), (1, None, 1), (0, None, 0), (1, None, 0)]


def _relay_calls(deltas: list[list[dict]]) -> list[list[int]]:
    relay = SseRelay(include_usage=False)
    out = b"".join(relay.feed(b"data: " + json.dumps(
        {**BASE, "choices": [{"index": 0, "delta": {"tool_calls": calls}}]}).encode() + b"\n\n", 0.0)
                   for calls in deltas)
    return [[call["index"] for call in json.loads(event[6:])["choices"][0]["delta"]["tool_calls"]]
            for event in out.split(b"\n\n") if event]


def test_an_index_the_backend_sent_is_kept_and_the_bytes_are_untouched():
    frame = b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":3,"id":"x","function":{}}]}}]}\n\n'
    assert SseRelay(include_usage=False).feed(frame, 0.0) == frame
    assert _relay_calls([[{"index": 2, "id": "x"}], [{"id": "y"}], [{"function": {}}], [{"id": "x"}]]) == [
        [2], [3], [3], [2]]


def test_several_calls_in_one_delta_get_consecutive_indices():
    assert _relay_calls([[{"id": "a"}, {"id": "b"}], [{"id": "b"}, {"id": "a"}], [{"function": {}}]]) == [
        [0, 1], [1, 0], [0]]

"""The bench load's retry of a connection the engine closed while idle (llama-server's HTTP library closes one after
5 requests): the request is sent again once and measured, not counted as failed; any other failure counts."""

from __future__ import annotations

import json

import httpx
import pytest

from llmgw.control.benching import BenchLoad, run_load
from llmgw.errors import UpstreamError


def _stream(prompt_tokens: int, tokens: int) -> bytes:
    lines = [{"choices": [{"text": " x", "index": 0}], "system_fingerprint": "b11434"} for _ in range(tokens)]
    lines.append({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}})
    return "".join(f"data: {json.dumps(line)}\n\n" for line in lines).encode() + b"data: [DONE]\n\n"


async def test_a_connection_closed_while_idle_is_retried_once_and_other_failures_count():
    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(200, json={"total_slots": 4, "build_info": "b11434"})
        calls.append(json.loads(request.content))
        if len(calls) in (2, 4, 5):  # request 1 meets a stale connection; request 3 meets two in a row
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        assert request.headers["authorization"] == "Bearer k"
        return httpx.Response(200, content=_stream(20, calls[-1]["max_tokens"]))

    load = BenchLoad("http://engine", "k", "gemma", prompt_tokens=16, output_tokens=3, requests=3)
    run = await run_load(load, transport=httpx.MockTransport(answer))
    assert run.prompt_words == 12  # the warm-up's 20 prompt tokens for 16 words: 4 fewer words
    assert [t.error[:19] for t in run.timings] == ["", "RemoteProtocolError", ""]
    assert [t.completion_tokens for t in run.timings] == [3, 0, 3] and run.engine_build == "b11434"
    assert run.slots == 4
    assert all(call["ignore_eos"] and call["stream"] for call in calls) and calls[0]["max_tokens"] == 1


async def test_a_target_that_refuses_the_warm_up_is_an_error_naming_it():
    load = BenchLoad("http://engine", None, "gemma", requests=2)
    transport = httpx.MockTransport(lambda request: httpx.Response(404, json={"error": "no model gemma"}))
    with pytest.raises(UpstreamError, match=r"http://engine did not answer a warm-up completion of model 'gemma': "
                                            r"HTTP 404"):
        await run_load(load, transport=transport)

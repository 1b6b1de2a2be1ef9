"""The engine relay runs a request with an `llmgw-once` key on the engine at most once (issue 32: a batch line is
never run twice across a leader's kill).

A real relay (`serve_relay`, in process) in front of the llama-server stand-in (0.1 s per token), counted by the
engine's own counter of the requests it took (`FakeLlamaServer.stats`). A sender that goes away mid-answer (as a
SIGKILLed control plane's connection does) leaves the request running; the same key again gets its answer, the
engine having run it once. A sender cut off inside the body leaves nothing on the engine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.engines.relay import RelayTarget, open_relay_listeners, serve_relay
from llmgw.engines.relay_framing import Refusal, parse_head
from llmgw.engines.relay_once import closing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from fake_llama_server import FakeLlamaServer  # noqa: E402

KEY = "once-test-replica-key"


def _request(prompt: str, once: str | None, *, keep_alive: bool = True) -> bytes:
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 4}).encode()
    head = ["POST /v1/completions HTTP/1.1", "Host: relay", f"Authorization: Bearer {KEY}",
            "Content-Type: application/json", f"Content-Length: {len(body)}"]
    head += [f"llmgw-once: {once}"] if once else []
    head += [] if keep_alive else ["Connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _read_all(stream: trio.SocketStream) -> bytes:
    data = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


@pytest.fixture
async def relay(nursery):
    engine = FakeLlamaServer(api_key=KEY, token_delay=0.1)
    engine_port = await nursery.start(engine.serve, "127.0.0.1", 0)
    listeners = await open_relay_listeners("127.0.0.1", 0)
    await nursery.start(serve_relay, listeners, RelayTarget("127.0.0.1", engine_port, KEY.encode()))
    return engine, listeners[0].socket.getsockname()[1]


async def test_a_keyed_request_whose_sender_went_away_runs_once_and_its_answer_comes_to_the_same_key(relay):
    engine, port = relay
    first = await trio.open_tcp_stream("127.0.0.1", port)
    await first.send_all(_request("line 1", "req_line1"))
    await trio.sleep(0.15)  # the engine is inside it (4 tokens: 0.4 s)
    assert engine.stats.processing == 1
    await first.aclose()  # the sender is gone, as a killed control plane's connection
    again = await trio.open_tcp_stream("127.0.0.1", port)
    await again.send_all(_request("line 1", "req_line1"))
    answer = await _read_all(again)  # the connection ends after a once answer
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head
    assert json.loads(body)["usage"]["completion_tokens"] == 4
    third = await trio.open_tcp_stream("127.0.0.1", port)
    await third.send_all(_request("line 1", "req_line1"))
    assert await _read_all(third) == answer  # kept: the same bytes, not a run
    assert engine.stats.requests["/v1/completions"] == 1 and engine.stats.predicted_tokens == 4


async def test_without_a_key_or_with_another_each_request_runs_and_a_key_again_gets_its_first_answer(relay):
    engine, port = relay
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                 headers={"authorization": f"Bearer {KEY}"}) as client:
        body = {"model": "m", "prompt": "p", "max_tokens": 1}
        for headers in ({}, {}, {"llmgw-once": "a"}, {"llmgw-once": "b"}, {"llmgw-once": "a"}):
            answered = await client.post("/v1/completions", json=body, headers=headers)  # one kept-alive pool
            assert answered.status_code == 200
        assert engine.stats.requests["/v1/completions"] == 4  # two without a key, a and b once each
        first = await client.post("/v1/completions", json=body, headers={"llmgw-once": "c"})
        again = await client.post("/v1/completions", json={**body, "stream": False}, headers={"llmgw-once": "c"})
        assert again.json() == first.json()  # the key names the request: its bytes as rewritten may differ
        assert engine.stats.requests["/v1/completions"] == 5


async def test_a_sender_cut_off_inside_the_body_leaves_nothing_on_the_engine(relay):
    engine, port = relay
    cut = await trio.open_tcp_stream("127.0.0.1", port)
    await cut.send_all(_request("line 2", "req_line2")[:-5])
    await trio.sleep(0.1)
    await cut.aclose()
    await trio.sleep(0.1)
    assert engine.stats.requests.get("/v1/completions", 0) == 0
    whole = await trio.open_tcp_stream("127.0.0.1", port)
    await whole.send_all(_request("line 2", "req_line2"))
    assert (await _read_all(whole)).startswith(b"HTTP/1.1 200")
    assert engine.stats.requests["/v1/completions"] == 1


async def test_an_engine_that_cannot_be_reached_is_a_502_on_every_try_of_the_key(nursery):
    listeners = await open_relay_listeners("127.0.0.1", 0)
    free = await trio.open_tcp_listeners(0, host="127.0.0.1")
    gone = free[0].socket.getsockname()[1]
    await free[0].aclose()
    await nursery.start(serve_relay, listeners, RelayTarget("127.0.0.1", gone, KEY.encode()))
    for _ in range(2):
        stream = await trio.open_tcp_stream("127.0.0.1", listeners[0].socket.getsockname()[1])
        await stream.send_all(_request("x", "req_x"))
        assert (await _read_all(stream)).startswith(b"HTTP/1.1 502")


def test_the_once_key_is_one_token_on_a_content_length_body_and_leaves_with_the_hop_fields():
    key = KEY.encode()
    base = f"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n"
    assert parse_head((base + "Content-Length: 2\r\nllmgw-once: req_1\r\n\r\n").encode(), key).once == b"req_1"
    for extra in ("llmgw-once: a\r\nllmgw-once: b\r\n", "llmgw-once: a b\r\n", "llmgw-once: \r\n",
                  f"llmgw-once: {'x' * 129}\r\n", "Transfer-Encoding: chunked\r\nllmgw-once: a\r\n"):
        with pytest.raises(Refusal) as refused:
            parse_head((base + extra + "\r\n").encode(), key)
        assert refused.value.status == 400
    assert closing(b"POST / HTTP/1.1\r\nConnection: keep-alive\r\nLLMGW-Once: a\r\nHost: x\r\n\r\n") == (
        b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")

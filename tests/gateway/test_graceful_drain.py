"""Graceful drain of the in-process gateway (`llmgw.gateway.draining`), through the official openai SDK against a
slowly streaming llama-server stand-in on loopback: stopping the gateway (cancelling `Gateway.serve`, as the
control plane's stop does) loses no request in flight, refuses what comes after with 503 and Retry-After, and
cuts what outlives the drain timeout with a well-formed error, billed what it used."""

from __future__ import annotations

import httpx
import openai
import trio
from gateway_harness import make_table, replica, start_engine

from llmgw.gateway import Gateway

TOKEN_DELAY = 0.05  # seconds between the stand-in's tokens


async def _serve(nursery, store, table, **kwargs) -> tuple[Gateway, str, trio.CancelScope, trio.Event]:
    """A gateway on 127.0.0.1:0 in a cancel scope of its own: (gateway, base URL with /v1, its scope, an Event set
    once `serve` has returned)."""
    gateway = Gateway(store, table, **kwargs)
    scope, ended = trio.CancelScope(), trio.Event()

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            with scope:
                await gateway.serve("127.0.0.1", 0, task_status=task_status)
        finally:
            ended.set()

    port = await nursery.start(run)
    return gateway, f"http://127.0.0.1:{port}/v1", scope, ended


async def _until(predicate, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


def _rows(store, client_id: str) -> list:
    return [record for _id, record in store.usage_of_client_request(client_id)]


async def test_a_stop_lets_requests_in_flight_finish_refuses_new_ones_and_records_each_once(nursery, store):
    engine, url = await start_engine(nursery, token_delay=TOKEN_DELAY)
    gateway, base, scope, ended = await _serve(nursery, store, make_table({"gemma": [replica("g-1", url)]}),
                                               settle_wait=30.0, drain_timeout=20.0)
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0, timeout=30)
    probe = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0, timeout=30)
    raw = httpx.AsyncClient(base_url=base.removesuffix("/v1"))
    assert (await probe.models.list()).data  # both keep a connection open to the gateway
    assert (await raw.get("/health")).json()["status"] == "ok"
    answers: dict[str, str] = {}

    async def one(i: int) -> None:
        ask = {"model": "gemma", "max_tokens": 20, "extra_headers": {"x-request-id": f"drain-{i}"},
               "messages": [{"role": "user", "content": f"question {i}"}]}
        if i % 2:
            stream = await client.chat.completions.create(stream=True, **ask)
            text = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
            answers[f"drain-{i}"] = "".join(text)
        else:
            answers[f"drain-{i}"] = (await client.chat.completions.create(**ask)).choices[0].message.content

    async with trio.open_nursery() as clients:
        for i in range(8):
            clients.start_soon(one, i)
        await _until(lambda: engine.stats.processing == 8)  # every request is at the engine (about 1 s each)
        scope.cancel()  # the control plane stops
        await _until(lambda: gateway.drain_state.draining)

        health = await raw.get("/health")  # a kept-alive connection: answered, then closed
        assert (health.status_code, health.json()["status"]) == (503, "draining")
        try:
            await probe.models.list()
            raise AssertionError("a request after the drain began was served")
        except openai.APIStatusError as refused:
            assert refused.status_code == 503 and refused.body["code"] == "gateway_draining"
            assert refused.response.headers["retry-after"] == "2"
            assert refused.response.headers["connection"] == "close"
        async with httpx.AsyncClient() as fresh:
            try:
                await fresh.get(f"{base}/models")  # a new connection: the listener is closed
                raise AssertionError("a new connection was accepted while draining")
            except httpx.ConnectError:
                pass
        assert not ended.is_set()  # still draining: the requests in flight run on

    await _until(ended.is_set)
    assert len(answers) == 8 and all(answers.values())
    for i in range(8):
        (row,) = _rows(store, f"drain-{i}")  # each request billed exactly once
        assert row.status == 200 and row.completion_tokens > 0
    await raw.aclose()


async def test_a_stream_longer_than_the_drain_timeout_ends_with_an_error_event_and_is_billed(nursery, store):
    engine, url = await start_engine(nursery, token_delay=1.0)  # 8 to 15 tokens: 8 to 15 s
    _gateway, base, scope, ended = await _serve(nursery, store, make_table({"gemma": [replica("g-1", url)]}),
                                                settle_wait=30.0, drain_timeout=1.0)
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0, timeout=30)
    ask = {"model": "gemma", "max_tokens": 400, "messages": [{"role": "user", "content": "a long story"}]}
    chunks: list = []
    outcome: dict[str, openai.APIError] = {}

    async def streamed() -> None:
        try:
            stream = await client.chat.completions.create(stream=True, extra_headers={"x-request-id": "long-s"},
                                                          **ask)
            async for chunk in stream:
                chunks.append(chunk)
        except openai.APIError as error:
            outcome["stream"] = error

    async def whole() -> None:
        try:
            await client.chat.completions.create(extra_headers={"x-request-id": "long-w"}, **ask)
        except openai.APIStatusError as error:
            outcome["whole"] = error

    async with trio.open_nursery() as clients:
        clients.start_soon(streamed)
        clients.start_soon(whole)
        await _until(lambda: engine.stats.processing == 2 and len(chunks) >= 2)  # some tokens streamed
        scope.cancel()
        stopping = trio.current_time()
    await _until(ended.is_set)
    assert trio.current_time() - stopping < 6  # cut at the drain timeout (1 s), not at the answers' end (7 s on)

    assert "drain timeout" in str(outcome["stream"])  # the SDK raised the error event that ended the stream
    refused = outcome["whole"]
    assert isinstance(refused, openai.APIStatusError)
    assert refused.status_code == 503 and refused.body["code"] == "gateway_stopped"
    (row,) = _rows(store, "long-s")
    assert row.status == 503 and row.prompt_tokens > 0 and row.completion_tokens >= 1  # billed what it used
    (row,) = _rows(store, "long-w")
    assert row.status == 503 and row.prompt_tokens > 0  # its prompt reached the engine


async def test_a_stop_closes_an_idle_keep_alive_connection_at_once_after_streamed_answers(nursery, store):
    """A client that keeps its connection open after a few streamed answers (the SDK's pool does) does not hold the
    stop for hypercorn's graceful timeout (5 s): the idle connection closes as soon as the drain is done."""
    _engine, url = await start_engine(nursery)
    table = make_table({"gemma": [replica("gemma-1", url, upstream_model="/models/gemma.gguf")]})
    gateway, base, scope, ended = await _serve(nursery, store, table, settle_wait=30.0)
    _key, plaintext = store.create_api_key("chat")
    async with openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0, timeout=30) as client:
        for _ in range(3):
            stream = await client.chat.completions.create(model="gemma", max_tokens=5, stream=True,
                                                          messages=[{"role": "user", "content": "hi"}])
            assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        stopping = trio.current_time()
        scope.cancel()  # the client's keep-alive connection is still open
        await _until(ended.is_set)
        assert trio.current_time() - stopping < 2  # not hypercorn's graceful timeout (5 s)

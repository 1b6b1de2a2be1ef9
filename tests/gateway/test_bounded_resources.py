"""Bounded resources at the gateway and billing on an early disconnect (issue 19 item 4, defects 5, 6 and 12).

Unknown model names under one metric label and usage value; the request body's read deadline and minimum rate; the
HTTP/2 streams a client connection may open at once; a client that leaves a non-streamed request still pays its
prompt.
"""

from __future__ import annotations

import httpx
import openai
import pytest
import trio
from gateway_harness import make_table, replica, start_engine, start_gateway

from llmgw.gateway.admission import UNKNOWN_MODEL
from llmgw.gateway.app import MAX_STREAMS_PER_CONNECTION
from llmgw.gateway.asgi import read_body
from llmgw.gateway.problems import ApiError

USER = [{"role": "user", "content": "tell me a story"}]


async def test_unknown_model_names_are_counted_and_recorded_under_one_label(nursery, store):
    # issue 19 defect 5: 200 requests with 100 KB names grew /metrics to 40 MB, for good
    _engine, url = await start_engine(nursery)
    gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]}))
    _key, plaintext = store.create_api_key("chat")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    names = [f"no-such-model-{i:03d}-" + "x" * 200 for i in range(30)]
    for name in names:
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model=name, messages=USER)
    with pytest.raises(openai.BadRequestError):  # past the name length bound: refused before lookup
        await client.chat.completions.create(model="y" * 100_000, messages=USER)
    metrics = gateway.metrics.render().decode()
    assert f'llmgw_gateway_requests_total{{model="{UNKNOWN_MODEL}",project="chat",status="404"}} 30.0' in metrics
    assert "no-such-model" not in metrics and len(metrics) < 20_000
    assert {r.model for r in store.recent_usage(limit=100)} == {UNKNOWN_MODEL}


def _trickle(chunks: list[tuple[float, bytes]]):
    """An ASGI receive that delivers each chunk after its delay (seconds), then waits for ever."""
    queue = list(chunks)

    async def receive():
        if not queue:
            await trio.sleep_forever()
        delay, data = queue.pop(0)
        await trio.sleep(delay)
        return {"type": "http.request", "body": data, "more_body": bool(queue) or data == b"..."}

    return receive


async def test_a_body_that_stops_coming_is_cut_at_its_read_deadline(autojump_clock):
    # issue 19 defect 6: read_timeout was None, so a key holder could hold a connection and its buffer for ever
    began = trio.current_time()
    with pytest.raises(ApiError) as info:
        await read_body(_trickle([(1.0, b"{"), (2.0, b"...")]), {b"content-length": b"1000"}, 10_000,
                        grace_seconds=10.0, min_bytes_per_second=1024)
    assert (info.value.status, info.value.code) == (408, "request_timeout")
    assert 10.0 <= trio.current_time() - began <= 10.1  # grace plus 4 bytes at 1 KiB/s


async def test_a_body_that_trickles_below_the_minimum_rate_is_cut(autojump_clock):
    chunks = [(0.9, b"x" * 100)] * 1000  # 111 bytes/s for ever, under 1 KiB/s
    began = trio.current_time()
    with pytest.raises(ApiError) as info:
        await read_body(_trickle(chunks), {}, 10**9, grace_seconds=5.0, min_bytes_per_second=1024)
    assert info.value.status == 408 and trio.current_time() - began < 7.0


async def test_a_large_body_at_the_minimum_rate_is_read_whole(autojump_clock):
    chunks = [(0.5, b"x" * 1024)] * 40  # 2 KiB/s: above the minimum
    raw = await read_body(_trickle(chunks), {}, 10**9, grace_seconds=1.0, min_bytes_per_second=1024)
    assert len(raw) == 40 * 1024


async def test_a_slow_client_on_a_real_socket_gets_a_408(nursery, store):
    _engine, url = await start_engine(nursery)
    _gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]}),
                                         body_grace_seconds=0.5, body_min_bytes_per_second=1024)
    _key, plaintext = store.create_api_key("chat")
    port = int(base.rsplit(":", 1)[1].split("/")[0])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                              b"authorization: Bearer " + plaintext.encode() + b"\r\ncontent-length: 5000\r\n\r\n{")
        answer = b""
        with trio.fail_after(5):
            while b"request_timeout" not in answer:
                answer += await stream.receive_some(4096)
    assert answer.startswith(b"HTTP/1.1 408")


async def test_http2_connections_may_open_at_most_the_stated_number_of_streams(nursery, store):
    import h2.config
    import h2.connection
    import h2.events
    import h2.settings

    _gateway, base = await start_gateway(nursery, store, make_table({}))
    port = int(base.rsplit(":", 1)[1].split("/")[0])
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(connection.data_to_send())
        offered = None
        with trio.fail_after(5):
            while offered is None:
                for event in connection.receive_data(await stream.receive_some(65536)):
                    if isinstance(event, h2.events.RemoteSettingsChanged):
                        changed = event.changed_settings.get(h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS)
                        if changed is not None:
                            offered = changed.new_value
    assert offered == MAX_STREAMS_PER_CONNECTION == 100


async def test_an_early_disconnect_on_a_non_streamed_request_bills_the_prompt(nursery, store):
    # issue 19 defect 12: a client that left before the answer was billed 0 prompt tokens
    engine, url = await start_engine(nursery, token_delay=0.2)  # the answer takes 2-3 s
    _gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]}))
    _key, plaintext = store.create_api_key("chat")

    async def ask_then_leave() -> None:
        async with httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {plaintext}"}) as client:
            with trio.move_on_after(5):
                await client.post("/chat/completions", json={"model": "gemma", "messages": USER, "max_tokens": 12})

    async with trio.open_nursery() as inner:
        inner.start_soon(ask_then_leave)
        with trio.fail_after(5):
            while not engine.stats.processing:
                await trio.sleep(0.01)
        inner.cancel_scope.cancel()  # the client leaves while the engine works
    with trio.fail_after(5):
        while not store.recent_usage():
            await trio.sleep(0.02)
    [record] = store.recent_usage()
    assert record.status == 499 and record.completion_tokens == 0
    assert record.prompt_tokens == 4 + 4 + 3  # "tell me a story": 15 chars -> 4, one message (4), priming (3)

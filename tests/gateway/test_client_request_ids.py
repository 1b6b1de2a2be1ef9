"""The gateway accepts a client's own `x-request-id` (or makes one): it answers it back, keeps it in the usage record
beside its own unique id (which stays the record's key and what the engine is sent), with the settings commit the
replica was started from and the trace id. Real gateway on loopback, llama-server stand-in, the official openai
SDK, a real store."""

from __future__ import annotations

import openai
import pytest
import trio
from gateway_harness import make_table, replica, start_engine, start_gateway
from otlp_receiver import attributes, otlp_receiver

from llmgw.gateway import GatewayTracing
from llmgw.gateway.request_ids import RequestIds, client_request_id, trace_id_of
from llmgw.tracing import open_provider

MESSAGES = [{"role": "user", "content": "hi"}]
COMMIT = "9c" * 20
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(("value", "kept"), [
    (b"order-17", "order-17"),
    (b"0f8fad5b-d9cb-469f-a165-70867728950e", "0f8fad5b-d9cb-469f-a165-70867728950e"),
    (b"x" * 128, "x" * 128),
    (b"x" * 129, None),  # too long
    (b"", None),
    (b"two words", None),  # a space
    (b"tab\there", None),
    (b"line\r\nbreak", None),
    ("caf\u00e9".encode(), None),  # not ASCII
    (None, None),
])
def test_a_client_request_id_is_kept_only_when_short_and_visible_ascii(value, kept):
    assert client_request_id(value) == kept


@pytest.mark.parametrize(("value", "trace"), [
    (f"00-{TRACE}-00f067aa0ba902b7-01".encode(), TRACE),
    (f"00-{TRACE}-00f067aa0ba902b7-00".encode(), TRACE),  # not sampled: still the caller's trace
    (f" 00-{TRACE}-00f067aa0ba902b7-01 ".encode(), TRACE),
    (f"00-{'0' * 32}-00f067aa0ba902b7-01".encode(), None),  # the invalid all-zero id
    (f"00-{TRACE.upper()}-00f067aa0ba902b7-01".encode(), None),  # upper case is not W3C
    (b"00-4bf92f35-00f067aa0ba902b7-01", None),
    (b"garbage", None),
    (None, None),
])
def test_the_trace_id_is_read_from_a_w3c_traceparent(value, trace):
    assert trace_id_of(value) == trace


def test_the_answered_headers_name_the_clients_id_and_then_the_gateways():
    assert RequestIds("req_1").headers() == [(b"x-request-id", b"req_1")]
    assert RequestIds("req_1", "mine").headers() == [(b"x-request-id", b"mine"), (b"x-llmgw-request-id", b"req_1")]


async def _gateway(nursery, store, tracing=None):
    engine, url = await start_engine(nursery)
    table = make_table({"gemma": [replica("gemma-1", url, upstream_model="/models/gemma.gguf",
                                          settings_commit=COMMIT)]})
    gateway, base = await start_gateway(nursery, store, table, tracing=tracing)
    _key, plaintext = store.create_api_key("chat")
    return engine, gateway, openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)


async def test_a_clients_own_id_is_answered_and_kept_beside_the_gateways_unique_one(nursery, store):
    engine, _gateway_, client = await _gateway(nursery, store)
    own_ids = []
    for _ in range(2):  # the same client id twice: two records, two gateway ids
        raw = await client.chat.completions.with_raw_response.create(
            model="gemma", messages=MESSAGES, max_tokens=4, extra_headers={"x-request-id": "order-17"})
        assert raw.headers["x-request-id"] == "order-17"
        own_ids.append(raw.headers["x-llmgw-request-id"])
        assert engine.stats.headers[-1]["x-request-id"] == own_ids[-1]  # the engine gets the unique one
    assert own_ids[0] != own_ids[1]
    assert [rid for rid, _ in store.usage_of_client_request("order-17")] == own_ids[::-1]
    record = store.usage_of_request(own_ids[0])
    assert (record.client_request_id, record.settings_commit, record.trace_id) == ("order-17", COMMIT, None)

    # an id the gateway does not keep (a space in it) is ignored: the gateway's own id is answered
    raw = await client.chat.completions.with_raw_response.create(
        model="gemma", messages=MESSAGES, max_tokens=4, extra_headers={"x-request-id": "not kept"})
    own = raw.headers["x-request-id"]
    assert own.startswith("req_") and "x-llmgw-request-id" not in raw.headers
    assert store.usage_of_request(own).client_request_id is None

    # a refusal answers both ids and records the client's
    with pytest.raises(openai.NotFoundError) as refused:
        await client.chat.completions.create(model="no-such-model", messages=MESSAGES,
                                             extra_headers={"x-request-id": "order-18"})
    assert refused.value.request_id == "order-18"
    (rid, record), = store.usage_of_client_request("order-18")
    assert rid == refused.value.response.headers["x-llmgw-request-id"] and record.status == 404


async def test_the_usage_record_keeps_the_trace_id_of_the_requests_span_or_of_its_callers_traceparent(nursery, store):
    with otlp_receiver() as (endpoint, spans):
        tracing = GatewayTracing(open_provider(endpoint, "llmgw-gateway", sample_ratio=1.0))
        _engine, gateway, client = await _gateway(nursery, store, tracing)
        raw = await client.chat.completions.with_raw_response.create(model="gemma", messages=MESSAGES, max_tokens=4,
                                                                     extra_headers={"x-request-id": "mine"})
        await trio.to_thread.run_sync(gateway.tracing.provider.force_flush)
        [(_, span)] = list(spans)
    record = store.usage_of_request(raw.headers["x-llmgw-request-id"])
    assert record.trace_id == span.trace_id.hex()
    assert attributes(span)["llmgw.client_request_id"] == "mine"


async def test_an_untraced_request_keeps_its_callers_trace_id(nursery, store):
    _engine, _gateway_, client = await _gateway(nursery, store)
    raw = await client.chat.completions.with_raw_response.create(
        model="gemma", messages=MESSAGES, max_tokens=4,
        extra_headers={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"})
    assert store.usage_of_request(raw.headers["x-request-id"]).trace_id == TRACE

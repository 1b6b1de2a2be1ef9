"""One OpenTelemetry span per sampled gateway request, received by the test's OTLP/HTTP receiver (real OTLP
protobufs): named and attributed after the OpenTelemetry GenAI semantic conventions (the names are checked against
opentelemetry-semantic-conventions' own constants), with the request's steps as events. Off unless sampled."""

from __future__ import annotations

import openai
import pytest
import trio
from gateway_harness import make_table, replica, start_engine, start_gateway
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from otlp_receiver import attributes, otlp_receiver

from llmgw.gateway import GatewayTracing, open_gateway_tracing
from llmgw.tracing import open_provider

MESSAGES = [{"role": "user", "content": "Say something about deterministic text."}]


async def traced_gateway(nursery, store, endpoint: str, ratio: float):
    engine, url = await start_engine(nursery)
    table = make_table({"gemma": [replica("gemma-1", url, upstream_model="/models/gemma.gguf")]})
    tracing = GatewayTracing(open_provider(endpoint, "llmgw-gateway", sample_ratio=ratio))
    gateway, base = await start_gateway(nursery, store, table, tracing=tracing)
    _key, plaintext = store.create_api_key("chat")
    return engine, gateway, openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)


async def flushed(gateway, spans) -> list[tuple[dict, Span]]:
    await trio.to_thread.run_sync(gateway.tracing.provider.force_flush)
    return list(spans)


async def test_a_streamed_request_is_one_span_with_gen_ai_attributes_and_its_steps_as_events(nursery, store):
    with otlp_receiver() as (endpoint, spans):
        engine, gateway, client = await traced_gateway(nursery, store, endpoint, 1.0)
        stream = await client.chat.completions.create(model="gemma", messages=MESSAGES, stream=True, max_tokens=16,
                                                      temperature=0.5, stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        request_id = stream.response.headers["x-request-id"]
        received = await flushed(gateway, spans)
    [(resource, span)] = received
    assert resource["service.name"] == "llmgw-gateway"
    assert span.name == "chat gemma" and span.kind == Span.SPAN_KIND_SERVER
    found = attributes(span)
    usage = chunks[-1].usage
    assert found[gen_ai.GEN_AI_OPERATION_NAME] == gen_ai.GenAiOperationNameValues.CHAT.value
    assert found[gen_ai.GEN_AI_REQUEST_MODEL] == "gemma"
    assert found[gen_ai.GEN_AI_REQUEST_MAX_TOKENS] == 16 and found[gen_ai.GEN_AI_REQUEST_TEMPERATURE] == 0.5
    assert found[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] == usage.prompt_tokens
    assert found[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] == usage.completion_tokens
    assert found["http.response.status_code"] == 200 and "error.type" not in found
    assert (found["llmgw.request_id"], found["llmgw.project"]) == (request_id, "chat")
    assert (found["llmgw.replica"], found["llmgw.node"], found["server.address"]) == ("gemma-1", "node-a",
                                                                                      "127.0.0.1")
    assert span.status.code != Status.STATUS_CODE_ERROR
    # the steps, in order, inside the span; the first token's time is the usage record's TTFT
    assert [e.name for e in span.events] == ["admitted", "upstream response", "first token"]
    times = [span.start_time_unix_nano, *(e.time_unix_nano for e in span.events), span.end_time_unix_nano]
    assert times == sorted(times)
    record = store.usage_of_request(request_id)
    assert abs(found["llmgw.ttft_seconds"] - record.ttft_seconds) < 1e-9
    # the engine was told the same id
    assert engine.stats.headers[-1]["x-request-id"] == request_id


async def test_a_refused_request_is_a_span_with_its_error_and_still_has_its_id(nursery, store):
    with otlp_receiver() as (endpoint, spans):
        _engine, gateway, client = await traced_gateway(nursery, store, endpoint, 1.0)
        with pytest.raises(openai.NotFoundError) as refused:
            await client.chat.completions.create(model="no-such-model", messages=MESSAGES)
        received = await flushed(gateway, spans)
    [(_, span)] = received
    found = attributes(span)
    assert span.name == "chat (unknown)"  # never the client's free text
    assert found["http.response.status_code"] == 404 and found["error.type"] == "404"
    assert found["llmgw.request_id"] == refused.value.request_id
    assert span.status.code == Status.STATUS_CODE_ERROR
    assert store.usage_of_request(refused.value.request_id).status == 404


async def test_unsampled_requests_make_no_span_unless_their_caller_sampled_the_trace(nursery, store):
    with otlp_receiver() as (endpoint, spans):
        _engine, gateway, client = await traced_gateway(nursery, store, endpoint, 0.0)
        await client.chat.completions.create(model="gemma", messages=MESSAGES)
        trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        await client.chat.completions.create(model="gemma", messages=MESSAGES, extra_headers={
            "traceparent": f"00-{trace_id}-{parent_id}-01"})
        received = await flushed(gateway, spans)
    [(_, span)] = received
    assert (span.trace_id.hex(), span.parent_span_id.hex()) == (trace_id, parent_id)


def test_request_tracing_is_off_without_an_endpoint_or_a_ratio():
    assert open_gateway_tracing(None, 1.0) is None
    assert open_gateway_tracing("http://127.0.0.1:4318", 0.0) is None
    with pytest.raises(ValueError, match="between 0 and 1"):
        open_gateway_tracing("http://127.0.0.1:4318", 1.5)

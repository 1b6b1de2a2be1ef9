"""The pure parts of passing Responses and Messages to an engine's own endpoint (`llmgw.gateway.native`,
`native_events`): which routes go native, the usage each dialect reports, and the engines' streams reshaped for the
client (llama-server b11434's, captured on loopback; vLLM 0.32's, made by its own classes: tests/fixtures/hand-made/).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType

import pytest

from llmgw.gateway.native import (
    MESSAGES, RESPONSES, messages_usage_numbers, responses_engine_body, responses_usage_numbers, serves_natively,
)
from llmgw.gateway.native_events import NativeMessageEvents, NativeResponseEvents
from llmgw.routes import ModelRoute, ReplicaRoute

VLLM = Path(__file__).resolve().parents[1] / "fixtures" / "hand-made" / "vllm-0.32-dialects"
# llama-server b11434, SmolLM2 135M Instruct, `POST /v1/responses` with `"stream": true, "max_output_tokens": 5`
# (captured 2026-12-04 with curl; the model path shortened, timings dropped, deltas cut to two)
LLAMA_RESPONSES_STREAM = b"""event: response.created
data: {"type":"response.created","response":{"id":"resp_onEArNPlECh12bWMPt5yM1lPQtMBnCeW","object":"response","status":"in_progress"}}

event: response.in_progress
data: {"type":"response.in_progress","response":{"id":"resp_onEArNPlECh12bWMPt5yM1lPQtMBnCeW","object":"response","status":"in_progress"}}

event: response.output_item.added
data: {"type":"response.output_item.added","item":{"content":[],"id":"msg_sphq","role":"assistant","status":"in_progress","type":"message"}}

event: response.content_part.added
data: {"type":"response.content_part.added","item_id":"msg_sphq","part":{"type":"output_text","text":""}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_sphq","delta":"The"}

event: response.output_text.delta
data: {"type":"response.output_text.delta","item_id":"msg_sphq","delta":" capital"}

event: response.output_text.done
data: {"type":"response.output_text.done","item_id":"msg_sphq","text":"The capital"}

event: response.content_part.done
data: {"type":"response.content_part.done","item_id":"msg_sphq","part":{"type":"output_text","annotations":[],"logprobs":[],"text":"The capital"}}

event: response.output_item.done
data: {"type":"response.output_item.done","item":{"type":"message","status":"completed","id":"msg_sphq","content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"The capital"}],"role":"assistant"}}

event: response.completed
data: {"type":"response.completed","response":{"id":"resp_onEArNPlECh12bWMPt5yM1lPQtMBnCeW","object":"response","created_at":1796404772,"status":"completed","model":"/cache/mirror/sha256/b179","output":[{"type":"message","status":"completed","id":"msg_sphq","content":[{"type":"output_text","annotations":[],"logprobs":[],"text":"The capital"}],"role":"assistant"}],"usage":{"input_tokens":37,"output_tokens":2,"total_tokens":39,"input_tokens_details":{"cached_tokens":36}}},"timings":{"cache_n":36}}

"""
# llama-server b11434, `POST /v1/messages` with `"stream": true, "max_tokens": 2` (captured the same way)
LLAMA_MESSAGES_STREAM = b"""event: message_start
data: {"type":"message_start","message":{"id":"chatcmpl-z757","type":"message","role":"assistant","content":[],"model":"/cache/mirror/sha256/b179","stop_reason":null,"stop_sequence":null,"usage":{"cache_read_input_tokens":36,"input_tokens":1,"output_tokens":0}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Le"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" Grand"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence":null},"usage":{"output_tokens":2}}

event: message_stop
data: {"type":"message_stop"}

"""


def _route(engine: str, *, external: bool = False, fields: dict | None = None) -> ModelRoute:
    return ModelRoute(name="m", engine=engine, body_fields=MappingProxyType(fields or {}),
                      replicas=(ReplicaRoute("r", "n", "http://10.0.0.1:80", external=external),))


@pytest.mark.parametrize(("route", "dialect", "native"), [
    (_route("llama.cpp"), RESPONSES, True), (_route("llama.cpp"), MESSAGES, True),
    (_route("vllm"), RESPONSES, True), (_route("vllm"), MESSAGES, True),
    (_route("sglang"), RESPONSES, False), (_route(""), MESSAGES, False),
    (_route("vllm", external=True), RESPONSES, False),
    (_route("llama.cpp", fields={"lora": [{"id": 0, "scale": 0.0}]}), MESSAGES, False),
    (_route("vllm"), "/v1/chat/completions", False),
])
def test_only_engines_that_serve_the_dialect_themselves_get_it_natively(route, dialect, native):
    assert serves_natively(route, dialect) is native


@pytest.mark.parametrize(("usage", "numbers"), [
    ({"input_tokens": 37, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 36}}, (37, 5, 36)),
    ({"input_tokens": 20, "output_tokens": 7}, (20, 7, 0)),
    ({"input_tokens": "x", "output_tokens": None, "input_tokens_details": None}, (0, 0, 0)),
])
def test_responses_usage_is_the_whole_prompt_and_the_output(usage, numbers):
    assert responses_usage_numbers(usage) == numbers


@pytest.mark.parametrize(("usage", "numbers"), [
    ({"cache_read_input_tokens": 36, "input_tokens": 1, "output_tokens": 8}, (37, 8, 36)),
    ({"input_tokens": 4, "output_tokens": 7, "cache_read_input_tokens": 16, "cache_creation_input_tokens": 2},
     (22, 7, 16)),
    ({"output_tokens": 4}, (None, 4, 0)),  # llama-server's message_delta
])
def test_messages_usage_adds_the_cached_tokens_back_to_the_prompt(usage, numbers):
    assert messages_usage_numbers(usage) == numbers


def test_the_engine_is_sent_the_whole_context_without_state_and_with_the_reserved_limit():
    body = {"model": "alias", "input": "And Italy?", "previous_response_id": "resp_1", "seed": 7}
    items = [{"type": "message", "role": "user", "content": "France?"}, {"type": "message", "role": "user",
                                                                        "content": "And Italy?"}]
    sent = responses_engine_body(body, items, "gemma", {"max_tokens": 64})
    assert sent == {"model": "gemma", "input": items, "store": False, "seed": 7, "max_output_tokens": 64}


def _events(data: bytes, split: int | None, events) -> tuple[list[dict], bytes]:
    out = b""
    pieces = [data] if split is None else [data[i:i + split] for i in range(0, len(data), split)]
    for piece in pieces:
        out += events.feed(piece)
    out += events.finish()
    parsed = [json.loads(line[6:]) for line in out.split(b"\n") if line.startswith(b"data: ")]
    return parsed, out


@pytest.mark.parametrize("split", [None, 1, 7, 100])
def test_llama_servers_responses_stream_gets_the_gateways_ids_sequence_and_indices(split):
    events = NativeResponseEvents("resp_gw", 1700000000, {"model": "smol", "input": "x", "store": True})
    sent, raw = _events(LLAMA_RESPONSES_STREAM, split, events)
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    assert all(e["response"]["id"] == "resp_gw" and e["response"]["model"] == "smol" for e in sent if "response" in e)
    assert all(e["output_index"] == 0 for e in sent if "item_id" in e or "item" in e)
    assert all(e["content_index"] == 0 for e in sent if e["type"].startswith(("response.content_part",
                                                                               "response.output_text")))
    assert sent[0]["response"]["status"] == "in_progress" and sent[0]["response"]["tools"] == []
    assert sent[-1]["type"] == "response.output_item.done" and b"response.completed" not in raw  # held back
    assert (events.prompt_tokens, events.completion_tokens, events.cached_tokens, events.counted) == (37, 2, 36, 2)
    final = json.loads(events.terminal.split(b"\ndata: ", 1)[1])
    assert final["type"] == "response.completed" and final["sequence_number"] == len(sent)
    assert events.final["id"] == "resp_gw" and events.final["output"][0]["content"][0]["text"] == "The capital"
    assert events.final["usage"]["input_tokens_details"] == {"cached_tokens": 36} and events.final["store"] is True


def test_vllms_responses_stream_keeps_its_indices_and_gives_its_usage():
    events = NativeResponseEvents("resp_gw", 1700000000, {"model": "gemma", "input": "x"})
    sent, _raw = _events((VLLM / "responses_stream.txt").read_bytes(), 50, events)
    original = [json.loads(line[6:]) for line in (VLLM / "responses_stream.txt").read_bytes().split(b"\n")
                if line.startswith(b"data: ")]
    assert [e.get("output_index") for e in sent] == [e.get("output_index") for e in original[:-1]]
    assert (events.prompt_tokens, events.completion_tokens, events.cached_tokens, events.counted) == (20, 7, 16, 7)
    assert events.final["status"] == "completed" and events.final["id"] == "resp_gw"


@pytest.mark.parametrize(("stream", "numbers"), [
    (LLAMA_MESSAGES_STREAM, (37, 2, 36, 2)),
    ((VLLM / "messages_stream.txt").read_bytes(), (20, 7, 16, 7)),
])
def test_a_messages_stream_gets_the_gateways_id_and_model_and_gives_its_usage(stream, numbers):
    events = NativeMessageEvents("msg_gw", "smol")
    sent, _raw = _events(stream, 13, events)
    assert sent[0]["message"]["id"] == "msg_gw" and sent[0]["message"]["model"] == "smol"
    assert sent[-1]["type"] == "message_delta" and events.terminal == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    assert (events.prompt_tokens, events.completion_tokens, events.cached_tokens, events.counted) == numbers

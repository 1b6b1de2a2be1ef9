"""Reshaping engine streams: usage chunk as OpenAI shapes it, split frames, llama-server's finish-chunk usage."""

from __future__ import annotations

import json

import pytest

from llmgw.gateway import SseRelay

BASE = {"id": "chatcmpl-1", "created": 1, "model": "gemma", "object": "chat.completion.chunk"}
USAGE = {"completion_tokens": 2, "prompt_tokens": 5, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 3}}


def frame(chunk) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def delta(text):
    return {**BASE, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


FINISH = {**BASE, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "timings": {"predicted_n": 2}}
# b11434 chat stream with include_usage (server-task.cpp): finish chunk, then choices [] + usage + timings
NEW_STYLE = [frame(delta("a")), frame(delta(" b")), frame(FINISH),
             frame({**BASE, "choices": [], "usage": USAGE, "timings": {}}), b"data: [DONE]\n\n"]
# older builds / completion streams: usage and timings on the finish chunk with non-empty choices
OLD_STYLE = [frame(delta("a")), frame(delta(" b")), frame({**FINISH, "usage": USAGE}), b"data: [DONE]\n\n"]


def run(relay: SseRelay, pieces: list[bytes]) -> list[dict]:
    out = b"".join(relay.feed(p, float(i)) for i, p in enumerate(pieces)) + relay.finish()
    events = [e[6:] for e in out.split(b"\n\n") if e]
    assert all(e != b"[DONE]" for e in events), "[DONE] is the caller's to send"
    return [json.loads(e) for e in events]


@pytest.mark.parametrize("style", [NEW_STYLE, OLD_STYLE], ids=["usage-chunk", "usage-on-finish-chunk"])
def test_client_that_asked_for_usage_gets_one_usage_chunk_and_null_elsewhere(style):
    relay = SseRelay(include_usage=True)
    chunks = run(relay, style)
    assert [c["usage"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == USAGE
    assert relay.usage.done
    assert (relay.usage.prompt_tokens, relay.usage.completion_tokens, relay.usage.cached_tokens) == (5, 2, 3)


@pytest.mark.parametrize("style", [NEW_STYLE, OLD_STYLE], ids=["usage-chunk", "usage-on-finish-chunk"])
def test_client_that_did_not_ask_sees_no_usage_at_all(style):
    relay = SseRelay(include_usage=False)
    chunks = run(relay, style)
    assert all("usage" not in c for c in chunks)
    assert all(c["choices"] for c in chunks)
    assert relay.usage.completion_tokens == 2


def test_frames_split_anywhere_are_reassembled():
    whole = b"".join(NEW_STYLE)
    relay = SseRelay(include_usage=False)
    pieces = [whole[i:i + 7] for i in range(0, len(whole), 7)]
    chunks = run(relay, pieces)
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["a", " b", None]


def test_tokens_are_counted_from_chunks_before_usage_arrives():
    relay = SseRelay(include_usage=False)
    relay.feed(frame(delta("a")) + frame(delta(" b"))[:10], 1.5)
    assert relay.usage.counted_chunks == 1 and relay.usage.first_token_at == 1.5
    assert relay.usage.completion_tokens is None


def test_upstream_model_name_is_written_back_as_the_clients():
    relay = SseRelay(include_usage=False, client_model="g3", upstream_model="gemma")
    out = relay.feed(b'data: {"model":"gemma","choices":[{"index":0,"delta":{"content":"x"}}]}\n\n', 0.0)
    assert json.loads(out[6:])["model"] == "g3"


def test_per_choice_usages_of_n_choices_merge_into_one_usage_chunk():
    # captured from llama-server b11434, chat, n=2, include_usage: one usage-only chunk per choice, mid-stream
    per_choice = {"completion_tokens": 2, "prompt_tokens": 10, "total_tokens": 12,
                  "prompt_tokens_details": {"cached_tokens": 0}}
    second = {**BASE, "choices": [{"index": 1, "delta": {"content": "hi"}, "finish_reason": None}]}
    pieces = [frame(delta("Hi")), frame(second), frame(FINISH), frame({**BASE, "choices": [], "usage": per_choice}),
              frame(second), frame({**BASE, "choices": [], "usage": per_choice}), b"data: [DONE]\n\n"]
    relay = SseRelay(include_usage=True)
    chunks = run(relay, pieces)
    usage_chunks = [c for c in chunks if c["usage"] is not None]
    assert usage_chunks == [chunks[-1]] and chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 4 and chunks[-1]["usage"]["prompt_tokens"] == 10
    assert relay.usage.completion_tokens == 4


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("style", [NEW_STYLE, OLD_STYLE], ids=["usage-chunk", "usage-on-finish-chunk"])
def test_events_read_together_are_relayed_as_the_same_bytes_as_events_read_one_by_one(style, include_usage):
    """The gateway relays everything one engine read brought in one write (issue 11): several events per read,
    one per read and a byte per read give the client the same bytes and the gateway the same usage."""
    whole = b"".join(style)
    outputs = []
    for pieces in (style, [whole], [whole[:len(whole) // 2], whole[len(whole) // 2:]],
                   [whole[i:i + 1] for i in range(len(whole))]):
        relay = SseRelay(include_usage=include_usage)
        out = b"".join(relay.feed(p, 1.0) for p in pieces) + relay.finish()
        outputs.append((out, relay.usage.done, relay.usage.counted_chunks, relay.usage.completion_tokens))
    assert all(o == outputs[0] for o in outputs[1:])
    assert outputs[0][1:] == (True, 2, 2) and b'" b"' in outputs[0][0] and b"[DONE]" not in outputs[0][0]


def test_an_unchanged_event_is_relayed_as_the_very_bytes_it_came_in():
    event = frame(delta("a"))
    assert SseRelay(include_usage=False).feed(event, 0.0) is event


def test_an_error_event_inside_a_read_of_several_events_is_seen_and_relayed_in_place():
    """An engine's error event between token events of one read (the batched path) is taken as the stream's error
    and relayed where it came, as when each event is read alone or the bytes arrive one at a time."""
    error = {"error": {"message": "out of memory", "type": "server_error", "code": 500}}
    events = [frame(delta("a")), frame(error), frame(delta(" b"))]
    whole = b"".join(events)
    outputs = []
    for pieces in (events, [whole], [whole[i:i + 1] for i in range(len(whole))]):
        relay = SseRelay(include_usage=False)
        out = b"".join(relay.feed(p, 1.0) for p in pieces) + relay.finish()
        outputs.append((out, relay.usage.error, relay.usage.counted_chunks))
    assert all(o == outputs[0] for o in outputs[1:])
    out, seen, counted = outputs[0]
    assert seen == error["error"] and counted == 2
    assert out.index(b"out of memory") < out.index(b'" b"') and out.index(b'"a"') < out.index(b"out of memory")

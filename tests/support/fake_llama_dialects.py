"""llama-server b11434's own `/v1/responses` and `/v1/messages`, for the stand-in `fake_llama_server`.

Shapes as b11434 answers them (captured on loopback on 2026-12-04 with SmolLM2, see
tests/gateway/test_native_dialect_events.py): a short Response object (id, object, created_at, status, model, output,
usage with `input_tokens_details.cached_tokens`); its stream's events carry no `sequence_number`, `output_index` or
`content_index`; `previous_response_id` is refused with 400 ("llama.cpp does not support 'previous_response_id'.").
Messages: the answer's id is a `chatcmpl-` id, usage `cache_read_input_tokens` / `input_tokens` / `output_tokens`; its
stream's `message_delta` carries only `output_tokens`. Text and token counts are the stand-in's own (`_generate`).
"""

from __future__ import annotations

import json
import time

import trio


def _frame(name: str, payload: dict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + json.dumps(payload).encode() + b"\n\n"


def _prompt(request: dict, path: str) -> tuple[str, int]:
    text = json.dumps(request.get("input") if path.endswith("responses") else request.get("messages"))
    return text, max(1, len(text.split())) + 4


def _events(path: str, pieces: list[str], ids: tuple[str, str], model: str, usage: dict) -> list[bytes]:
    text = "".join(pieces)
    if path.endswith("messages"):
        start = {"id": ids[0], "type": "message", "role": "assistant", "content": [], "model": model,
                 "stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 0}}
        return [_frame("message_start", {"type": "message_start", "message": start}),
                _frame("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}}),
                *[_frame("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                 "delta": {"type": "text_delta", "text": p}}) for p in pieces],
                _frame("content_block_stop", {"type": "content_block_stop", "index": 0}),
                _frame("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                                            "stop_sequence": None},
                                         "usage": {"output_tokens": usage["output_tokens"]}}),
                _frame("message_stop", {"type": "message_stop"})]
    interim = {"id": ids[0], "object": "response", "status": "in_progress"}
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    item = {"type": "message", "status": "completed", "id": ids[1], "content": [part], "role": "assistant"}
    final = {"id": ids[0], "object": "response", "created_at": int(time.time()), "status": "completed",
             "model": model, "output": [item], "usage": usage}
    return [_frame("response.created", {"type": "response.created", "response": interim}),
            _frame("response.in_progress", {"type": "response.in_progress", "response": interim}),
            _frame("response.output_item.added", {"type": "response.output_item.added", "item": {
                "content": [], "id": ids[1], "role": "assistant", "status": "in_progress", "type": "message"}}),
            _frame("response.content_part.added", {"type": "response.content_part.added", "item_id": ids[1],
                                                   "part": {"type": "output_text", "text": ""}}),
            *[_frame("response.output_text.delta", {"type": "response.output_text.delta", "item_id": ids[1],
                                                    "delta": p}) for p in pieces],
            _frame("response.output_text.done", {"type": "response.output_text.done", "item_id": ids[1],
                                                 "text": text}),
            _frame("response.content_part.done", {"type": "response.content_part.done", "item_id": ids[1],
                                                  "part": part}),
            _frame("response.output_item.done", {"type": "response.output_item.done", "item": item}),
            _frame("response.completed", {"type": "response.completed", "response": final})]


async def answer_dialect(engine, send, path: str, request: dict, send_json) -> None:
    """Answer `request` to `path` ("/v1/responses" or "/v1/messages") as b11434 (module docstring), with the
    stand-in `engine`'s text, `token_delay` between streamed tokens and stats; `send_json(send, status, payload)`."""
    if path.endswith("responses") and request.get("previous_response_id"):
        await send_json(send, 400, {"error": {"code": 400, "type": "invalid_request_error",
                                              "message": "llama.cpp does not support 'previous_response_id'."}})
        return
    text, prompt_tokens = _prompt(request, path)
    limit = request.get("max_output_tokens") or request.get("max_tokens") or engine.max_tokens_default
    pieces = engine._generate(text, request.get("seed"), 0, int(limit), None)["pieces"]
    engine._ids += 1
    ids = ((f"chatcmpl-fake{engine._ids:06d}" if path.endswith("messages") else f"resp_fake{engine._ids:06d}"),
           f"msg_fake{engine._ids:06d}")
    model = request.get("model") or engine.alias
    if path.endswith("messages"):
        usage = {"cache_read_input_tokens": 0, "input_tokens": prompt_tokens, "output_tokens": len(pieces)}
    else:
        usage = {"input_tokens": prompt_tokens, "output_tokens": len(pieces),
                 "total_tokens": prompt_tokens + len(pieces), "input_tokens_details": {"cached_tokens": 0}}
    engine.stats.prompt_tokens += prompt_tokens
    engine.stats.predicted_tokens += len(pieces)
    events = _events(path, pieces, ids, model, usage)
    if not request.get("stream"):
        last = json.loads(events[-1].split(b"\ndata: ", 1)[1])
        if path.endswith("messages"):
            whole = {"id": ids[0], "type": "message", "role": "assistant", "model": model,
                     "content": [{"type": "text", "text": "".join(pieces)}], "stop_reason": "end_turn",
                     "stop_sequence": None, "usage": usage}
        else:
            whole = {**last["response"], "completed_at": last["response"]["created_at"]}
        await send_json(send, 200, whole)
        return
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
    for event in events:
        await send({"type": "http.response.body", "body": event, "more_body": True})
        if engine.token_delay and b"delta" in event[:40]:
            await trio.sleep(engine.token_delay)
    await send({"type": "http.response.body", "body": b"", "more_body": False})

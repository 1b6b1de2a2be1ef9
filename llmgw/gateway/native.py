"""Which engines serve the Responses and Messages dialects themselves, and what the gateway sends and bills then.

Pure: no I/O. The gateway passes a `/v1/responses` or `/v1/messages` request to the engine's own endpoint of that
path ("native") when `serves_natively` says the route's engine serves it, and translates it to chat otherwise
(`responses_chat`, `anthropic`). Keys, the project's allowlist, quotas and usage records are the same both ways:
admission runs on the chat translation of the request (the prompt's bound and the reserved completion tokens,
`admission.Admission.admit`), only the body forwarded and the answer's parsing differ.

NATIVE_DIALECTS, by engine (the catalog's `engine`, `ModelRoute.engine`), for the versions llmgw installs:
- "llama.cpp" (b11434): `/v1/responses` and `/v1/messages` (tools/server/server.cpp registers both, handled by
  `post_responses_oai` and `post_anthropic_messages` in tools/server/server-context.cpp). It refuses
  `previous_response_id` ("llama.cpp does not support 'previous_response_id'.", tools/server/server-chat.cpp) and
  keeps no response: the gateway sends the whole context instead.
- "vllm" (0.32): `/v1/responses` (vllm/entrypoints/openai/responses/api_router.py) and `/v1/messages`
  (vllm/entrypoints/anthropic/api_router.py). Its own response store is off unless
  VLLM_ENABLE_RESPONSES_API_STORE is set, and lives in one replica's memory: the gateway sends `store: false` and
  the whole context.
Not native: "sglang" and engines of unknown kind (""), external endpoints (`ReplicaRoute.external`: any OpenAI-
compatible server, no promise of either path) and LoRA adapter routes (their `engine` is "").

State (Responses): the gateway keeps it either way. A native request is sent with `previous_response_id` expanded
into `input` (the stored context, then its output, then this turn's input: `responses_chat.context_items`) and
`store: false`; the engine's answer (its output items and usage) is put in the gateway's Response frame (its own
id, the client's model name, `previous_response_id` and `store` as the client sent them: `native_response`) and
stored as a translated one is. So a conversation may move between a native and a translated engine.

Usage: Responses' `usage.input_tokens` (the whole prompt), `output_tokens`, `input_tokens_details.cached_tokens`
(`responses_usage_numbers`); Messages' `usage.input_tokens` + `cache_read_input_tokens` +
`cache_creation_input_tokens` (Anthropic counts input_tokens without the cache's) and `output_tokens`
(`messages_usage_numbers`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmgw.gateway.responses_chat import response_object, response_usage
from llmgw.routes import ModelRoute

RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
NATIVE_DIALECTS: Mapping[str, frozenset[str]] = {
    "llama.cpp": frozenset({RESPONSES, MESSAGES}),
    "vllm": frozenset({RESPONSES, MESSAGES}),
}
"""Engine (catalog `engine`) -> the dialects' paths it serves itself (module docstring for the sources)."""
ENGINE_API_HEADER = b"x-llmgw-engine-api"
"""Answer header naming the engine's path that answered a forwarded request: for a Responses or Messages request
the dialect's own path when served natively, /v1/chat/completions when translated."""


def serves_natively(route: ModelRoute, dialect: str) -> bool:
    """Whether requests of `dialect` (RESPONSES or MESSAGES) to `route` go to its engines' own endpoint: its engine
    is in NATIVE_DIALECTS for that path, none of its replicas is an external endpoint, and the route sets no body
    fields of its own (`ModelRoute.body_fields`: llama.cpp's `lora` scales of a model with adapters, which
    llama-server's /v1/messages drops, server_chat_convert_anthropic_to_oai copying only the fields it knows)."""
    return (dialect in NATIVE_DIALECTS.get(route.engine, ()) and not route.body_fields
            and not any(r.external for r in route.replicas))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def responses_usage_numbers(usage: Mapping[str, Any]) -> tuple[int, int, int]:
    """(prompt, completion, cached) tokens of a Responses `usage` object; missing or bad fields are 0."""
    details = usage.get("input_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    return _count(usage.get("input_tokens")), _count(usage.get("output_tokens")), cached


def messages_usage_numbers(usage: Mapping[str, Any]) -> tuple[int | None, int | None, int]:
    """(prompt, completion, cached) tokens of an Anthropic `usage` object: prompt is input_tokens plus the tokens
    read from and written to the cache, cached the tokens read. None for a count the object leaves out (a stream's
    message_delta of llama-server carries only output_tokens)."""
    cached = _count(usage.get("cache_read_input_tokens"))
    prompt = None
    if "input_tokens" in usage:
        prompt = _count(usage.get("input_tokens")) + cached + _count(usage.get("cache_creation_input_tokens"))
    completion = _count(usage.get("output_tokens")) if "output_tokens" in usage else None
    return prompt, completion, cached


def responses_engine_body(body: Mapping[str, Any], items: list[dict[str, Any]], model: str,
                          overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The body for an engine's own `/v1/responses`: the client's `body` (as it sent it) with `input` the whole
    context `items`, no `previous_response_id`, `store` false, `model` the engine's name for the model, and the
    admission's enforced fields under Responses' names (`max_tokens` -> `max_output_tokens`)."""
    out = {k: v for k, v in body.items() if k != "previous_response_id"}
    out.update(model=model, input=items, store=False)
    for name, value in overrides.items():
        out["max_output_tokens" if name == "max_tokens" else name] = value
    return out


def native_response(engine_answer: Mapping[str, Any], response_id: str, created_at: float,
                    body: Mapping[str, Any]) -> dict[str, Any]:
    """The gateway's Response object around an engine's Responses answer (or a streamed event's `response`):
    `responses_chat.response_object` of the client's `body` (its model name, previous_response_id, store, tools...)
    with the engine's `output`, `usage` (normalised: `responses_usage_numbers`), `status` and
    `incomplete_details`. Whatever the engine left out (llama-server b11434 sends a short object) is filled in; an
    answer whose output reached the client's `max_output_tokens` is `incomplete` (reason `max_output_tokens`), as
    OpenAI's is, whatever the engine said (llama-server b11434 says `completed`)."""
    usage = engine_answer.get("usage")
    numbers = responses_usage_numbers(usage) if isinstance(usage, Mapping) else None
    output = engine_answer.get("output")
    frame = response_object(response_id, created_at, body, list(output) if isinstance(output, list) else [],
                            response_usage(*numbers) if numbers else None, None)
    status = engine_answer.get("status")
    frame["status"] = status if isinstance(status, str) else "completed"
    limit = body.get("max_output_tokens")
    if (frame["status"] == "completed" and numbers and isinstance(limit, int) and numbers[1] >= limit
            and not engine_answer.get("incomplete_details")):  # llama-server b11434 says completed when cut
        frame["status"], frame["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
    elif "incomplete_details" in engine_answer:
        frame["incomplete_details"] = engine_answer["incomplete_details"]
    elif frame["status"] == "incomplete":
        frame["incomplete_details"] = {"reason": "max_output_tokens"}
    if isinstance(engine_answer.get("error"), Mapping):
        frame["error"] = dict(engine_answer["error"])
    return frame


def native_message(engine_answer: dict[str, Any], message_id: str, model: str) -> dict[str, Any]:
    """An engine's Messages answer as the client gets it: the gateway's `message_id` and the client's `model`."""
    return {**engine_answer, "id": message_id, "model": model}

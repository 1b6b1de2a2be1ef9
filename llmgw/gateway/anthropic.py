"""Anthropic's Messages API as the gateway speaks it: the request checked and translated to a chat completion, the
answer translated back, errors in Anthropic's shape. Pure: data in, data out (the stream is `anthropic_stream`, the
endpoint `anthropic_endpoint`).

Requests (`POST /v1/messages`, `/v1/messages/count_tokens`) are checked against REQUEST_SCHEMA (the fields of
Anthropic's `MessageCreateParams` the gateway translates; unknown fields pass) and translated by `to_chat`:
- `system` (a string or text blocks) becomes the first message, role system;
- a user turn's `text` blocks become its content (one string when there is no image; an `image` block, base64 or
  url, becomes an `image_url` part); its `tool_result` blocks become `tool` messages (before the rest of the turn),
  `tool_call_id` the `tool_use_id`, the content its text (an error prefixed "Error: ");
- an assistant turn's `tool_use` blocks become `tool_calls` (`arguments` the `input` as JSON); `thinking` and
  `redacted_thinking` blocks of earlier turns are dropped (engines cannot check their signatures);
- `tools` become functions (`input_schema` the parameters); `tool_choice` auto/any/tool/none becomes
  auto/required/{function}/none, `disable_parallel_tool_use` `parallel_tool_calls: false`;
- `max_tokens`, `temperature`, `top_p`, `top_k` keep their names; `stop_sequences` becomes `stop`; `stream: true`
  asks for the usage chunk too (`stream_options.include_usage`), which becomes `message_delta`'s usage;
- Anthropic's fields that mean nothing to a chat engine (ANTHROPIC_ONLY: `metadata`, `thinking`, `output_config`,
  ...) are dropped; any other field (an engine's own, as `seed`) passes as it is, and the chat request as a whole
  is then checked against OpenAI's chat schema (`validation.validate_request`) as a chat request is.
A `document` block, server tools (a tool with a `type` other than "custom") and anything else the chat API cannot
say are refused with a 400 naming the field.

Answers (`from_chat`): the text becomes one `text` block, each tool call a `tool_use` block (`input` the parsed
arguments), `finish_reason` stop/length/tool_calls a `stop_reason` end_turn/max_tokens/tool_use, usage
`input_tokens` (without the cached ones), `cache_read_input_tokens` and `output_tokens`.
Errors (`error_body`): `{"type": "error", "error": {"type", "message"}}`, the type from the status (ERROR_TYPES).
Source: https://docs.anthropic.com/en/api/messages, /en/api/errors, /en/api/messages-count-tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

import jsonschema_rs

from llmgw.gateway.explaining import Problem, explain
from llmgw.gateway.problems import ApiError, bad_request
from llmgw.gateway.validation import MAX_MODEL_NAME_CHARS, MAX_TOKENS_CAP

MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
VERSION_PATTERN = re.compile(r"^\d{4}-\d{2}-\d{2}$")
"""`anthropic-version` as Anthropic dates its API versions (the SDK of 2026 sends 2026-10-21); any date is taken."""

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "overloaded_error",
               504: "timeout_error", 529: "overloaded_error"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                "content_filter": "refusal"}

_TEXT_BLOCK = {"type": "object", "required": ["type", "text"],
               "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_BLOCK = {"type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}
_PROPERTIES = {
    "model": {"type": "string", "maxLength": MAX_MODEL_NAME_CHARS},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS_CAP},
    "messages": {"type": "array", "items": {
        "type": "object", "required": ["role", "content"],
        "properties": {"role": {"enum": ["user", "assistant"]},
                       "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]}}}},
    "system": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}]},
    "stop_sequences": {"type": "array", "items": {"type": "string"}},
    "stream": {"type": "boolean"},
    "temperature": {"type": "number", "minimum": 0, "maximum": 1},
    "top_p": {"type": "number", "minimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 0},
    "metadata": {"type": "object"},
    "tools": {"type": "array", "items": {
        "type": "object", "required": ["name"],
        "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 128},
                       "description": {"type": "string"}, "type": {"type": "string"},
                       "input_schema": {"type": "object"}}}},
    "tool_choice": {"type": "object", "required": ["type"],
                    "properties": {"type": {"enum": ["auto", "any", "tool", "none"]}, "name": {"type": "string"},
                                   "disable_parallel_tool_use": {"type": "boolean"}}},
}
REQUEST_SCHEMA = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                  "required": ["model", "max_tokens", "messages"], "properties": _PROPERTIES}
"""What `/v1/messages` checks (Anthropic's MessageCreateParams, the fields translated; others pass)."""
COUNT_SCHEMA = {**REQUEST_SCHEMA, "required": ["model", "messages"]}
"""What `/v1/messages/count_tokens` checks (no `max_tokens`)."""


_TRANSLATED = frozenset({"model", "max_tokens", "messages", "system", "stop_sequences", "stream", "temperature",
                         "top_p", "top_k", "tools", "tool_choice"})
ANTHROPIC_ONLY = frozenset({"metadata", "thinking", "output_config", "cache_control", "service_tier", "container",
                            "diagnostics", "inference_geo", "speed", "user_profile_id", "workspace_id", "mcp_servers",
                            "context_management", "betas"})
"""Fields of Anthropic's API that mean nothing to a chat engine: accepted and not forwarded. Any other field the
translation does not know (an engine's own: `seed`, `min_p`, `cache_prompt`, ...) passes to the engine as it is."""


def error_body(status: int, message: str) -> bytes:
    """Anthropic's error object for an answer of `status`, UTF-8 JSON."""
    return json.dumps({"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error" if status >= 500
                                                                             else "invalid_request_error"),
                                                  "message": message}}).encode()


def openai_error_message(body: bytes) -> str:
    """The message of an OpenAI-shaped error body (`problems.ApiError.body`), or the body's text."""
    try:
        parsed = json.loads(body)
        message = parsed["error"]["message"]
        if isinstance(message, str) and message:
            return message
    except (ValueError, KeyError, TypeError):
        pass
    return body.decode("utf-8", "replace")[:2000] or "The request failed."


@cache
def _validator(count: bool) -> jsonschema_rs.Draft7Validator:
    return jsonschema_rs.Draft7Validator(COUNT_SCHEMA if count else REQUEST_SCHEMA)


def check_request(body: dict, *, count: bool = False) -> None:
    """Check a parsed body against REQUEST_SCHEMA (COUNT_SCHEMA when `count`). Raises ApiError 400 naming the
    field (`param` as `messages[0].content`)."""
    validator = _validator(count)
    if not validator.is_valid(body):
        problem = explain(validator, COUNT_SCHEMA if count else REQUEST_SCHEMA, body) or Problem(
            None, "invalid_value", "The request body does not match Anthropic's Messages API.")
        raise bad_request(problem.message, problem.code, problem.param)


def check_version(value: bytes | None) -> None:
    """Check an `anthropic-version` header (None: absent, taken). Raises ApiError 400 for one that is no date."""
    if value is not None and not VERSION_PATTERN.match(value.decode("latin-1")):
        raise bad_request(f"anthropic-version {value.decode('latin-1')[:40]!r} is not a version; send a date such "
                          "as 2023-06-01.", "invalid_version", "anthropic-version")


def to_chat(body: Mapping[str, Any], *, count: bool = False) -> dict:
    """The chat completion request meaning what a checked Messages request (`check_request`) means (module
    docstring). `count`: for count_tokens (no `max_tokens`, never streamed). Raises ApiError 400 for a block or
    tool the chat API cannot say, naming its field."""
    messages: list[dict] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": system if isinstance(system, str)
                         else "\n".join(block["text"] for block in system)})
    for index, message in enumerate(body["messages"]):
        messages.extend(_turn(message, f"messages[{index}]"))
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    if not count:
        chat["max_tokens"] = body["max_tokens"]
    for field in ("temperature", "top_p", "top_k"):
        if body.get(field) is not None:
            chat[field] = body[field]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    if body.get("stream") and not count:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    for field, value in body.items():  # the engine's own fields (seed, min_p, cache_prompt, ...) pass
        if field not in _TRANSLATED and field not in ANTHROPIC_ONLY and field not in chat:
            chat[field] = value
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools:
        chat["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    if choice:
        chat.update(_tool_choice(choice))
    return chat


def _turn(message: Mapping[str, Any], where: str) -> list[dict]:
    role, content = message["role"], message["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    texts: list[str] = []
    parts: list[dict] = []
    tool_calls: list[dict] = []
    results: list[dict] = []
    for index, block in enumerate(content):
        kind, at = block["type"], f"{where}.content[{index}]"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and role == "user":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, at)}})
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise bad_request(f"A tool_use block needs a string `id` and `name` ({at}).", "invalid_value", at)
            tool_calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise bad_request(f"A tool_result block needs a string `tool_use_id` ({at}).", "invalid_value", at)
            text = _result_text(block.get("content"), at)
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": f"Error: {text}" if block.get("is_error") is True else text})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        else:
            raise bad_request(f"This gateway cannot pass a {kind!r} block in a{'n' if role[0] == 'a' else ''} "
                              f"{role} turn ({at}); send text, image, tool_use or tool_result blocks.",
                              "invalid_value", f"{at}.type")
    turn: list[dict] = list(results)
    if role == "assistant":
        if texts or tool_calls:
            out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
            if tool_calls:
                out["tool_calls"] = tool_calls
            turn.append(out)
    elif len(parts) > len(texts):  # an image: content parts
        turn.append({"role": "user", "content": parts})
    elif texts or not results:
        turn.append({"role": "user", "content": "\n".join(texts)})
    return turn


def _image_url(block: Mapping[str, Any], at: str) -> str:
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str) \
            and isinstance(source.get("media_type"), str):
        return f"data:{source['media_type']};base64,{source['data']}"
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise bad_request(f"An image block needs a `source` of type base64 (media_type, data) or url ({at}).",
                      "invalid_value", f"{at}.source")


def _result_text(content, at: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                         and isinstance(b.get("text"), str) for b in content):
        return "\n".join(b["text"] for b in content)
    raise bad_request(f"A tool_result's content must be a string or text blocks here ({at}).", "invalid_value",
                      f"{at}.content")


def _tool(tool: Mapping[str, Any], at: str) -> dict:
    if tool.get("type") not in (None, "custom"):
        raise bad_request(f"The server tool {tool.get('type')!r} is not served here; define custom tools with "
                          f"name, description and input_schema ({at}).", "invalid_value", f"{at}.type")
    function: dict[str, Any] = {"name": tool["name"],
                                "parameters": tool.get("input_schema") or {"type": "object", "properties": {}}}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Mapping[str, Any]) -> dict:
    kind = choice["type"]
    out: dict[str, Any] = {}
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise bad_request("tool_choice of type tool needs the tool's `name`.", "invalid_value", "tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out


def anthropic_usage(prompt: int, completion: int, cached: int) -> dict:
    """Anthropic's usage object from OpenAI's numbers: input_tokens excludes the tokens read from the cache."""
    return {"input_tokens": max(0, prompt - cached), "output_tokens": completion,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def tool_input(arguments: str | None) -> dict:
    """A tool call's `arguments` (JSON text) as the `input` object; {} when they are empty or not an object."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def from_chat(answer: Mapping[str, Any], message_id: str, model: str) -> dict:
    """A chat completion (`choices[0]`, `usage`) as a Messages answer named `message_id`, `model` the client's."""
    choices = answer.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    content: list[dict] = []
    if isinstance(message.get("content"), str) and message["content"]:
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id") or f"toolu_{len(content)}",
                        "name": function.get("name") or "", "input": tool_input(function.get("arguments"))})
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    details = usage.get("prompt_tokens_details") or {}
    return {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": STOP_REASONS.get(choice.get("finish_reason"), "end_turn"), "stop_sequence": None,
            "usage": anthropic_usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                                     int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0)}


def message_id(request_id: str) -> str:
    """The answer's id from the gateway's request id ("req_" + hex -> "msg_" + hex)."""
    return "msg_" + request_id.removeprefix("req_")


def refused(error: ApiError) -> bytes:
    """An ApiError as Anthropic shapes errors."""
    return error_body(error.status, error.message)

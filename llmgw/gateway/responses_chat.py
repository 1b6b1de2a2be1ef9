"""The Responses API in chat's words and back: pure translation, no I/O (`responses` does the I/O).

A `/v1/responses` request becomes one `/v1/chat/completions` request for an engine that does not serve `/v1/responses`
itself (`native.serves_natively`; the chat request is also what admission reserves for, native or not):

- `context_items(previous_input, previous_output, body)`: the whole conversation as Responses input items: the
  stored context of `previous_response_id` (its input, then its output), then this request's `input` (a string is
  one user message). `instructions` are not carried from an earlier turn (OpenAI: "the instructions from a
  previous response will not be carried over").
- `chat_request(body, items)`: the chat body. Items: a message (`type` "message" or a bare `role`; content a
  string or `input_text`/`output_text`/`refusal` parts, `input_image` as an `image_url` part; role `developer`
  sent as `system`); `function_call` as an assistant message's `tool_calls` (consecutive calls joined);
  `function_call_output` as a `tool` message; `reasoning` (its `content` text, else its `summary` text) as the next
  assistant message's `reasoning_content` (llama-server's and vLLM's field). `instructions` is a first system message.
  Fields: `max_output_tokens` -> `max_tokens`; `temperature`, `top_p`, `parallel_tool_calls`, `stream` kept;
  `tools` of type `function` -> chat tools; `tool_choice` likewise; `text.format` -> `response_format`;
  `reasoning.effort` -> `reasoning_effort`; fields OpenAI's Responses schema does not define pass to the engine
  untouched (`top_k`, ...). Anything chat cannot express (built-in tools such as `web_search`, `item_reference`,
  `background`, `conversation`) is refused with a 400 naming the field.
- `output_items(message, ids)`: a chat answer's message as Responses output items: `reasoning` (from
  `reasoning_content`), then a `message` with one `output_text` part, then one `function_call` per tool call.
- `response_object(...)`: the Response object (OpenAI's `Response` schema) around those items and the usage
  (`input_tokens`, `input_tokens_details.cached_tokens`, `output_tokens`, `total_tokens`).

Sources: OpenAI's openapi.json at the vendored commit (`CreateResponse`, `Response`, `InputItem`, `OutputItem`),
https://platform.openai.com/docs/api-reference/responses.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from llmgw.gateway.problems import bad_request

RESPONSE_FIELDS = frozenset({
    "model", "input", "instructions", "previous_response_id", "store", "stream", "stream_options", "include",
    "max_output_tokens", "max_tool_calls", "temperature", "top_p", "top_logprobs", "tools", "tool_choice",
    "parallel_tool_calls", "text", "reasoning", "metadata", "user", "service_tier", "truncation", "background",
    "conversation", "prompt", "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "context_management",
})
"""The fields of OpenAI's `CreateResponse` (and its parents): every other field passes to the engine untouched."""
UNSUPPORTED = ("background", "conversation", "prompt")
"""Fields the gateway cannot serve (a stored prompt, a server-side conversation object, background mode)."""
COPIED = ("temperature", "top_p", "parallel_tool_calls", "stream", "user")


def new_id(prefix: str) -> str:
    """An item or response id: `prefix` + "_" + 32 hex digits (OpenAI's ids are opaque strings)."""
    return f"{prefix}_{secrets.token_hex(16)}"


def input_items(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """This request's `input` as a list of items: a string is one user message; absent is empty."""
    value = body.get("input")
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return [dict(item) for item in value]


def context_items(previous_input: Sequence[Mapping], previous_output: Sequence[Mapping],
                  body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The whole context of this turn: the previous response's context and output, then this request's input."""
    return [*(dict(i) for i in previous_input), *(dict(i) for i in previous_output), *input_items(body)]


def _text_of(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's content as chat content: a string as it is; parts as one string when all are text, else chat
    parts (`text`, `image_url`). Raises ApiError 400 for a part chat cannot carry (files, audio)."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content or ()):
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "reasoning_text", "summary_text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": part.get("refusal", "")})
        elif kind == "input_image" and part.get("image_url"):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"],
                                                             "detail": part.get("detail") or "auto"}})
        else:
            raise bad_request(f"This gateway cannot pass a content part of type '{kind}' to a model (only text and "
                              "images by URL).", "unsupported_value", f"{where}.content[{index}].type")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _messages(body: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages for `items`, after `instructions` as a system message."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        instructions = body["instructions"]
        messages.append({"role": "system", "content": _text_of(instructions, "instructions")
                         if not isinstance(instructions, str) else instructions})
    reasoning: list[str] = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            message: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                       "content": _text_of(item.get("content"), where)}
            if role == "assistant" and reasoning:
                message["reasoning_content"] = "".join(reasoning)
                reasoning = []
            messages.append(message)
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                message = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning:
                    message["reasoning_content"] = "".join(reasoning)
                    reasoning = []
                messages.append(message)
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else _text_of(output, where)})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning.append("".join(p.get("text", "") for p in parts if isinstance(p, Mapping)))
        else:
            raise bad_request(f"This gateway cannot pass an input item of type '{kind}' to a model (messages, "
                              "function calls and their outputs, and reasoning items only).", "unsupported_value",
                              f"{where}.type")
    return messages


def _tools(body: Mapping[str, Any]) -> dict[str, Any]:
    """`tools` and `tool_choice` in chat's shape ({} when the request has none)."""
    out: dict[str, Any] = {}
    tools = body.get("tools")
    if tools:
        chat_tools = []
        for index, tool in enumerate(tools):
            if tool.get("type") != "function":
                raise bad_request(f"This gateway serves function tools only, not '{tool.get('type')}'.",
                                  "unsupported_value", f"tools[{index}].type")
            function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object",
                                                                                       "properties": {}}}
            if tool.get("description"):
                function["description"] = tool["description"]
            if tool.get("strict") is not None:
                function["strict"] = tool["strict"]
            chat_tools.append({"type": "function", "function": function})
        out["tools"] = chat_tools
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        out["tool_choice"] = choice
    elif isinstance(choice, Mapping):
        if choice.get("type") != "function":
            raise bad_request(f"This gateway serves function tools only, not a tool_choice of type "
                              f"'{choice.get('type')}'.", "unsupported_value", "tool_choice.type")
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    return out


def _response_format(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format` (None: plain text)."""
    text = body.get("text")
    form = text.get("format") if isinstance(text, Mapping) else None
    if not isinstance(form, Mapping) or form.get("type") in (None, "text"):
        return None
    if form["type"] == "json_schema":
        schema = {k: form[k] for k in ("name", "schema", "strict", "description") if form.get(k) is not None}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": form["type"]}


def chat_request(body: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The chat body for a Responses request `body` whose whole context is `items` (see the module docstring).
    Raises ApiError 400 (`unsupported_value`, with `param`) for what chat cannot express."""
    for name in UNSUPPORTED:
        if body.get(name) is not None:
            raise bad_request(f"This gateway does not serve `{name}` on /v1/responses.", "unsupported_parameter",
                              name)
    chat: dict[str, Any] = {"model": body.get("model"), "messages": _messages(body, items)}
    if not chat["messages"]:
        raise bad_request("The request has no input: send `input` (a string or a list of items).",
                          "missing_required_parameter", "input")
    for name in COPIED:
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    chat.update(_tools(body))
    form = _response_format(body)
    if form is not None:
        chat["response_format"] = form
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("effort"):
        chat["reasoning_effort"] = reasoning["effort"]
    chat.update({k: v for k, v in body.items() if k not in RESPONSE_FIELDS})
    return chat


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    """A `reasoning` output item carrying `text` as its reasoning content."""
    return {"id": item_id, "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}],
            "status": "completed"}


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """An assistant `message` output item with one `output_text` part."""
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str,
                       status: str = "completed") -> dict[str, Any]:
    """A `function_call` output item."""
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def output_items(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A chat answer's `choices[0].message` as Responses output items (reasoning, message, function calls)."""
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_id("rs"), message["reasoning_content"]))
    if message.get("content"):
        content = message["content"]
        items.append(message_item(new_id("msg"), content if isinstance(content, str) else json.dumps(content)))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        items.append(function_call_item(new_id("fc"), call.get("id") or new_id("call"), function.get("name", ""),
                                        function.get("arguments") or ""))
    return items


def response_usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    """OpenAI's `ResponseUsage` for token counts (reasoning tokens are not told apart by chat engines: 0)."""
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + completion}


def response_object(response_id: str, created_at: float, body: Mapping[str, Any],
                    output: list[dict[str, Any]], usage: Mapping[str, Any] | None,
                    finish_reason: str | None) -> dict[str, Any]:
    """The Response object (OpenAI's `Response`) of request `body` with `output` items and `usage`.
    `finish_reason`: chat's ("length" makes it `incomplete` with reason `max_output_tokens`; None: in progress)."""
    status = "in_progress" if finish_reason is None else "incomplete" if finish_reason == "length" else "completed"
    text = body.get("text") if isinstance(body.get("text"), Mapping) else {}
    return {
        "id": response_id, "object": "response", "created_at": int(created_at), "status": status,
        "background": False, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"), "model": body.get("model"), "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": None},
        "service_tier": "default", "store": body.get("store", True) is not False,
        "temperature": body.get("temperature"), "text": {"format": {"type": "text"}, **text},
        "tool_choice": body.get("tool_choice", "auto"), "tools": list(body.get("tools") or ()),
        "top_logprobs": body.get("top_logprobs"), "top_p": body.get("top_p"), "truncation": "disabled",
        "usage": dict(usage) if usage is not None else None, "user": body.get("user"),
        "metadata": dict(body.get("metadata") or {}),
    }

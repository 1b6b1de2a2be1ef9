"""A chat stream's chunks as the Responses API's event stream: pure, one `ResponseEvents` per streamed response.

The sequence (OpenAI's `ResponseStreamEvent`s at the vendored openai-openapi commit; each event is an SSE frame
`event: <type>` + `data: <json>` carrying `type` and a rising `sequence_number`):

    response.created, response.in_progress
    per output item, in the order the engine sends them (reasoning, then text, then tool calls):
      response.output_item.added
      reasoning: response.reasoning_text.delta ... response.reasoning_text.done
      message:   response.content_part.added, response.output_text.delta ..., response.output_text.done,
                 response.content_part.done
      function call: response.function_call_arguments.delta ..., response.function_call_arguments.done
      response.output_item.done
    response.completed (or response.incomplete when the engine stopped at max_output_tokens)

An engine failure mid-stream ends with `response.failed` (`failed(message)`). The gateway's relay
(`responses.ResponsesRelay`) parses each chat chunk and feeds it here; only `choices[0]` is read (Responses has no
`n`). Nothing here does I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from llmgw.gateway.responses_chat import (
    function_call_item, message_item, new_id, reasoning_item, response_object,
)


def frame(event: Mapping[str, Any]) -> bytes:
    """One SSE frame of a Responses event (`event:` line, then one compact JSON `data:` line)."""
    return (b"event: " + event["type"].encode() + b"\ndata: "
            + json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n")


class ResponseEvents:
    """Events of one streamed response. `response_id`, `created_at` (epoch seconds) and the request `body` make
    the Response objects the events carry. `start()` first, then `chunk(...)` per chat chunk, then `finish(...)`
    or `failed(...)`; each returns the bytes to send. `output` holds the finished output items."""

    def __init__(self, response_id: str, created_at: float, body: Mapping[str, Any]):
        self.response_id, self.created_at, self.body = response_id, created_at, body
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self._text: dict[str, Any] | None = None  # the open reasoning or message item: {"item", "index", "text"}
        self._calls: dict[int, dict[str, Any]] = {}  # open function calls by chat tool-call index

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return frame(event)

    def _response(self, finish_reason: str | None, usage: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return response_object(self.response_id, self.created_at, self.body, list(self.output), usage, finish_reason)

    def start(self) -> bytes:
        """response.created and response.in_progress."""
        response = self._response(None)
        return self._event("response.created", response=response) + self._event("response.in_progress",
                                                                                 response=response)

    def chunk(self, chunk: Mapping[str, Any]) -> bytes:
        """The events of one chat chunk's `choices[0].delta` (b"" for a chunk without one)."""
        choices = chunk.get("choices") or ()
        if not choices or not isinstance(choices[0], Mapping):
            return b""
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta") or {}
        out = []
        if delta.get("reasoning_content"):
            out.append(self._text_delta("reasoning", delta["reasoning_content"]))
        if isinstance(delta.get("content"), str) and delta["content"]:
            out.append(self._text_delta("message", delta["content"]))
        for position, call in enumerate(delta.get("tool_calls") or ()):
            out.append(self._call_delta(call.get("index", position), call))
        return b"".join(out)

    def _text_delta(self, kind: str, text: str) -> bytes:
        out = b""
        if self._text is None or self._text["item"]["type"] != kind:
            out += self._close_text()
            index = len(self.output) + len(self._calls)
            if kind == "reasoning":
                item = {**reasoning_item(new_id("rs"), ""), "content": [], "status": "in_progress"}
            else:
                item = {**message_item(new_id("msg"), "", "in_progress"), "content": []}
            self._text = {"item": item, "index": index, "text": ""}
            out += self._event("response.output_item.added", output_index=index, item=item)
            if kind == "message":
                out += self._event("response.content_part.added", item_id=item["id"], output_index=index,
                                   content_index=0, part={"type": "output_text", "text": "", "annotations": []})
        state = self._text
        state["text"] += text
        item_id, index = state["item"]["id"], state["index"]
        if kind == "reasoning":
            return out + self._event("response.reasoning_text.delta", item_id=item_id, output_index=index,
                                     content_index=0, delta=text)
        return out + self._event("response.output_text.delta", item_id=item_id, output_index=index,
                                 content_index=0, delta=text, logprobs=[])

    def _close_text(self) -> bytes:
        state, self._text = self._text, None
        if state is None:
            return b""
        item, index, text = state["item"], state["index"], state["text"]
        if item["type"] == "reasoning":
            done = reasoning_item(item["id"], text)
            out = self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                              content_index=0, text=text)
        else:
            done = message_item(item["id"], text)
            part = done["content"][0]
            out = (self._event("response.output_text.done", item_id=item["id"], output_index=index,
                               content_index=0, text=text, logprobs=[])
                   + self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                 content_index=0, part=part))
        self.output.append(done)
        return out + self._event("response.output_item.done", output_index=index, item=done)

    def _call_delta(self, index: int, call: Mapping[str, Any]) -> bytes:
        out = b""
        function = call.get("function") or {}
        state = self._calls.get(index)
        if state is None:
            out += self._close_text()
            position = len(self.output) + len(self._calls)
            item = function_call_item(new_id("fc"), call.get("id") or new_id("call"), function.get("name") or "",
                                      "", "in_progress")
            state = self._calls[index] = {"item": item, "index": position}
            out += self._event("response.output_item.added", output_index=position, item=item)
        arguments = function.get("arguments") or ""
        if arguments:
            state["item"]["arguments"] += arguments
            out += self._event("response.function_call_arguments.delta", item_id=state["item"]["id"],
                               output_index=state["index"], delta=arguments)
        return out

    def _close_calls(self) -> bytes:
        out = b""
        for state in sorted(self._calls.values(), key=lambda s: s["index"]):
            item = {**state["item"], "status": "completed"}
            out += self._event("response.function_call_arguments.done", item_id=item["id"],
                               output_index=state["index"], name=item["name"], arguments=item["arguments"])
            self.output.append(item)
            out += self._event("response.output_item.done", output_index=state["index"], item=item)
        self._calls = {}
        return out

    def finish(self, usage: Mapping[str, Any] | None) -> tuple[bytes, dict[str, Any]]:
        """Close the open items and end with response.completed (or response.incomplete); returns the bytes and
        the final Response object (`usage`: `responses_chat.response_usage`, None when the engine sent none)."""
        out = self._close_text() + self._close_calls()
        response = self._response(self.finish_reason or "stop", usage)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, response=response), response

    def failed(self, message: str, code: str = "server_error") -> bytes:
        """End with response.failed: the Response with `status` "failed" and `error` {code, message}."""
        response = {**self._response(None), "status": "failed", "error": {"code": code, "message": message}}
        return self._event("response.failed", response=response)

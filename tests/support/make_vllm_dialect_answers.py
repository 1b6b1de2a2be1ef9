"""Write vLLM 0.32's answers to `/v1/responses` and `/v1/messages` (whole and streamed) into
tests/fixtures/hand-made/vllm-0.32-dialects/, built with vLLM's own protocol classes and serialised as its routers do.

No capture of a real vLLM answering these paths exists here (a real vLLM takes minutes to start), so the answers
are made by vLLM 0.32's code: `ResponsesResponse` and the openai `Response*Event` types dumped as
vllm/entrypoints/openai/responses/api_router.py does (`model_dump(mode="json", by_alias=True)`, SSE frames
`event: <type>` + `model_dump_json(indent=None, by_alias=True)`), the event order and indices of
streaming_events.py and serving.py (`response.created`, `response.in_progress`, item added, part added, deltas,
text done, part done, item done, `response.completed`); `AnthropicMessagesResponse` and `AnthropicStreamEvent`
dumped as vllm/entrypoints/anthropic/ api_router.py (`model_dump(exclude_none=True)`) and serving.py
(`model_dump_json(exclude_unset=True)`, `message_start` with the prompt's usage, `message_delta` with both) do.
The usage numbers are the fixtures' own: 20 prompt tokens of which 16 from the prefix cache, 7 generated.

Run with vLLM's interpreter: ~/.cache/llmgw/engines/vllm/0.32.0/bin/python tests/support/make_vllm_dialect_answers.py
"""

import json
from pathlib import Path

from openai.types.responses import (
    ResponseContentPartAddedEvent, ResponseContentPartDoneEvent, ResponseOutputItemAddedEvent, ResponseOutputItemDoneEvent, ResponseOutputMessage,
    ResponseOutputText, ResponseTextDeltaEvent, ResponseTextDoneEvent,
)
from vllm.entrypoints.anthropic.protocol import (
    AnthropicContentBlock, AnthropicDelta, AnthropicMessagesResponse, AnthropicStreamEvent, AnthropicUsage,
)
from vllm.entrypoints.openai.responses.protocol import (
    InputTokensDetails, OutputTokensDetails, ResponseCompletedEvent, ResponseCreatedEvent, ResponseInProgressEvent,
    ResponsesResponse, ResponseUsage,
)

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "hand-made" / "vllm-0.32-dialects"
MODEL = "gemma-3-270m"
DELTAS = ["The", " capital", " of", " France", " is", " Paris", "."]
TEXT = "".join(DELTAS)
ITEM = "msg_9f0c3a1d2e4b4c6f8a7d5e3b1c0f9a8d"


def response(status: str, output: list, usage) -> ResponsesResponse:
    return ResponsesResponse(
        id="resp_5e2d8c1f0a9b4e7d9c6f3a2b1d0e8f7c", created_at=1796400000, model=MODEL, output=output,
        parallel_tool_calls=True, temperature=1.0, tool_choice="auto", tools=[], top_p=1.0, background=False,
        max_output_tokens=2028, service_tier="auto", status=status, truncation="disabled", usage=usage)


def responses() -> None:
    usage = ResponseUsage(input_tokens=20, input_tokens_details=InputTokensDetails(cached_tokens=16,
                                                                                   cache_write_tokens=0),
                          output_tokens=7, output_tokens_details=OutputTokensDetails(), total_tokens=27)
    text = ResponseOutputText(type="output_text", text=TEXT, annotations=[], logprobs=[])
    message = ResponseOutputMessage(id=ITEM, type="message", role="assistant", content=[text], status="completed")
    whole = response("completed", [message], usage)
    (OUT / "responses.json").write_text(json.dumps(whole.model_dump(mode="json", by_alias=True), separators=(",", ":")))
    initial = response("in_progress", [], None).model_dump(mode="json", by_alias=True)
    events = [ResponseCreatedEvent(type="response.created", sequence_number=-1, response=initial),
              ResponseInProgressEvent(type="response.in_progress", sequence_number=-1, response=initial),
              ResponseOutputItemAddedEvent(type="response.output_item.added", sequence_number=-1, output_index=0,
                                           item=ResponseOutputMessage(id=ITEM, type="message", role="assistant",
                                                                      content=[], status="in_progress")),
              ResponseContentPartAddedEvent(type="response.content_part.added", sequence_number=-1, output_index=0,
                                            item_id=ITEM, content_index=0,
                                            part=ResponseOutputText(type="output_text", text="", annotations=[],
                                                                    logprobs=[]))]
    events += [ResponseTextDeltaEvent(type="response.output_text.delta", sequence_number=-1, content_index=0,
                                      output_index=0, item_id=ITEM, delta=delta, logprobs=[]) for delta in DELTAS]
    done = ResponseOutputText(type="output_text", text=TEXT, annotations=[])
    events += [ResponseTextDoneEvent(type="response.output_text.done", sequence_number=-1, output_index=0,
                                     content_index=0, text=TEXT, logprobs=[], item_id=ITEM),
               ResponseContentPartDoneEvent(type="response.content_part.done", sequence_number=-1, item_id=ITEM,
                                            output_index=0, content_index=0, part=done),
               ResponseOutputItemDoneEvent(type="response.output_item.done", sequence_number=-1, output_index=0,
                                           item=ResponseOutputMessage(id=ITEM, type="message", role="assistant",
                                                                      content=[done], status="completed")),
               ResponseCompletedEvent(type="response.completed", sequence_number=-1, response=whole)]
    frames = []
    for number, event in enumerate(events):
        event.sequence_number = number  # serving.py's _increment_sequence_number_and_return
        frames.append(f"event: {event.type}\ndata: {event.model_dump_json(indent=None, by_alias=True)}\n\n")
    (OUT / "responses_stream.txt").write_text("".join(frames))


def messages() -> None:
    usage = AnthropicUsage(input_tokens=4, output_tokens=7, cache_read_input_tokens=16)
    whole = AnthropicMessagesResponse(id="chatcmpl-7c1e9d2a4b3f4e8d", model=MODEL, stop_reason="end_turn",
                                      stop_sequence=None, usage=usage,
                                      content=[AnthropicContentBlock(type="text", text=TEXT)])
    (OUT / "messages.json").write_text(json.dumps(whole.model_dump(exclude_none=True), separators=(",", ":")))
    start = AnthropicStreamEvent(type="message_start", message=AnthropicMessagesResponse(
        id="chatcmpl-7c1e9d2a4b3f4e8d", type="message", role="assistant", content=[], model=MODEL, stop_reason=None,
        stop_sequence=None, usage=AnthropicUsage(input_tokens=4, output_tokens=0, cache_read_input_tokens=16)))
    events = [start, AnthropicStreamEvent(type="content_block_start", index=0,
                                          content_block=AnthropicContentBlock(type="text", text=""))]
    events += [AnthropicStreamEvent(type="content_block_delta", index=0,
                                    delta=AnthropicDelta(type="text_delta", text=delta)) for delta in DELTAS]
    events += [AnthropicStreamEvent(type="content_block_stop", index=0),
               AnthropicStreamEvent(type="message_delta", delta=AnthropicDelta(stop_reason="end_turn",
                                                                               stop_sequence=None), usage=usage),
               AnthropicStreamEvent(type="message_stop")]
    (OUT / "messages_stream.txt").write_text("".join(
        f"event: {event.type}\ndata: {event.model_dump_json(exclude_unset=True)}\n\n" for event in events))


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    responses()
    messages()

"""The prompt-token bound a reservation holds (issue 39 item 1): text by its UTF-8 bytes, media and tools by their
documented costs. The bound against a real engine's count: test_real_llama_server.py."""

from __future__ import annotations

import base64

from llmgw.gateway.accounting import estimate_prompt_tokens
from llmgw.gateway.token_bounds import (
    MEDIA_TOKENS, MESSAGE_TOKENS, REPLY_TOKENS, SPECIAL_TOKENS, TOOL_TOKENS, TOOLS_TOKENS, prompt_token_bound,
)

JAPANESE = "東京の天気について短い文章を書いてください。明日は晴れか、それとも雨が降るのですか。"


def test_text_counts_its_utf8_bytes_around_the_templates_costs():
    chat = {"messages": [{"role": "user", "content": JAPANESE}]}
    assert prompt_token_bound(chat) == REPLY_TOKENS + MESSAGE_TOKENS + len("user") + 126
    assert prompt_token_bound(chat) > 4 * estimate_prompt_tokens(chat)  # the old guess: 18
    assert prompt_token_bound({"prompt": "héllo"}) == 6 + SPECIAL_TOKENS
    assert prompt_token_bound({"prompt": [1, 2, 3]}) == 3 + SPECIAL_TOKENS
    assert prompt_token_bound({"input": ["ab", [7, 8]]}) == 2 + 2 + 2 * SPECIAL_TOKENS
    assert prompt_token_bound({"prompt": "def f(", "suffix": "return x"}) == 6 + SPECIAL_TOKENS + 8


def test_an_image_costs_its_documented_tokens_not_its_base64_bytes():
    picture = "data:image/png;base64," + base64.b64encode(b"\x89PNG" + bytes(100_000)).decode()
    parts = [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": picture}},
             {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]
    chat = {"messages": [{"role": "user", "content": parts}]}
    assert prompt_token_bound(chat) == REPLY_TOKENS + MESSAGE_TOKENS + 4 + 11 + 2 * MEDIA_TOKENS


def test_tool_definitions_and_calls_count_their_json():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    calls = [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    without = prompt_token_bound({"messages": messages})
    tools_json = '[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]'
    assert prompt_token_bound({"messages": messages, "tools": tools}) == (
        without + TOOLS_TOKENS + TOOL_TOKENS + len(tools_json))
    calls_json = '[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]'
    assert without == REPLY_TOKENS + 3 * MESSAGE_TOKENS + 4 + 2 + 9 + len(calls_json) + 4 + 2 + 5

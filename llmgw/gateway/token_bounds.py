"""An upper bound of a request's prompt tokens, computed from its body alone: what a quota reservation holds.

The bound is never below the engine's real count for the tokenizers llmgw serves (byte-level BPE, as GPT-2, Llama 3,
Qwen, Mistral's tekken; SentencePiece with byte fallback, as Gemma, Llama 2, Mistral v1-v3): each token stands for
at least one byte of UTF-8 text, so a text is at most its byte count in tokens (42 Japanese characters: 126 bytes,
which Gemma counts as about 35 tokens). Around the text, what chat templates add, counted as documented costs:

- each message: MESSAGE_TOKENS (its role header, separators and end-of-turn tokens; the role's and name's own bytes
  are counted as text); the reply's header and the start-of-text token: REPLY_TOKENS;
- message fields other than `content` (`tool_calls`, `tool_call_id`, `name`, ...) and tool definitions: the bytes of
  their compact JSON (templates render them as JSON text or terser); tool definitions add TOOLS_TOKENS once (the
  instructions a template wraps them in) and TOOL_TOKENS each;
- an image, audio or file part: MEDIA_TOKENS each (not its base64 bytes). Engines' costs per image: Gemma 3 256,
  LLaVA 1.5 576, LLaVA-NeXT at most 2,880, OpenAI's high detail at most 1,445 (85 + 170 per 512 px tile); a model
  whose images cost more (Qwen2-VL at large resolutions) can pass the bound by the difference;
- completions and embeddings: the prompt's bytes (token ids: their number) plus SPECIAL_TOKENS per prompt (start
  and end of text).

What the bound does not cover: text a chat template inserts by itself beyond these costs (Llama 3.1's default
system lines are about 25 tokens: within REPLY_TOKENS + MESSAGE_TOKENS of a one-message chat, not of a template that
adds hundreds). Those, and images beyond MEDIA_TOKENS, pass a limit by at most that excess per request.
Pure functions of a validated body; never raise.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

MESSAGE_TOKENS = 8
REPLY_TOKENS = 32
TOOLS_TOKENS = 256
TOOL_TOKENS = 16
MEDIA_TOKENS = 4096
SPECIAL_TOKENS = 2
MEDIA_PARTS = frozenset({"image_url", "input_image", "input_audio", "audio_url", "video_url", "file"})


def _bytes(value) -> int:
    """UTF-8 bytes of a string, or of the compact JSON of anything else (None: 0)."""
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def _content(content) -> int:
    """The bound of a message's `content`: its text's bytes; parts: text bytes, MEDIA_TOKENS per media part."""
    if not isinstance(content, list):
        return _bytes(content)
    total = 0
    for part in content:
        if isinstance(part, Mapping) and part.get("type") in MEDIA_PARTS:
            total += MEDIA_TOKENS
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            total += _bytes(part["text"])
        else:
            total += _bytes(part)
    return total


def _prompts(prompt) -> int:
    """The bound of a completions `prompt` or an embeddings `input`: a text, token ids, or a batch of either."""
    if isinstance(prompt, str):
        return _bytes(prompt) + SPECIAL_TOKENS
    if isinstance(prompt, list):
        if all(isinstance(item, int) and not isinstance(item, bool) for item in prompt):
            return len(prompt) + SPECIAL_TOKENS
        return sum(_prompts(item) for item in prompt)
    return _bytes(prompt) + SPECIAL_TOKENS


def prompt_token_bound(body: Mapping) -> int:
    """Prompt tokens a request cannot exceed (module docstring): chat (`messages`), completions (`prompt`, and its
    `suffix`), embeddings (`input`). At least 1."""
    if "messages" in body:
        messages = body.get("messages")
        total = REPLY_TOKENS
        for message in messages if isinstance(messages, list) else ():
            if not isinstance(message, Mapping):
                total += MESSAGE_TOKENS + _bytes(message)
                continue
            total += MESSAGE_TOKENS + sum(_content(value) if key == "content" else _bytes(value)
                                          for key, value in message.items())
        for field in ("tools", "functions"):
            defined = body.get(field)
            if isinstance(defined, list) and defined:
                total += TOOLS_TOKENS + TOOL_TOKENS * len(defined) + _bytes(defined)
        return total
    if "prompt" in body:
        return max(1, _prompts(body.get("prompt")) + (_bytes(body.get("suffix")) if body.get("suffix") else 0))
    return max(1, _prompts(body.get("input")))

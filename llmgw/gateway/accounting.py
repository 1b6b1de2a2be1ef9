"""Estimating a request's tokens and cost before it runs, and the `x-ratelimit-*` headers.

Estimate (reserved before admitting): prompt characters / 4 (chat: the text of every message plus
MESSAGE_OVERHEAD tokens per message and REPLY_PRIMING for the reply's header, as chat templates add them;
completions: the prompt; embeddings: the input) plus `max_tokens` (or `max_completion_tokens`) times `n`, or DEFAULT_MAX_TOKENS
when the request sets none. Settled later with the engine's own usage. Costs use the model's prices per million
tokens (None = free).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from llmgw.routes import ModelRoute

CHARS_PER_TOKEN = 4
DEFAULT_MAX_TOKENS = 256
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3


def _text_length(value) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_length(v) for v in value)
    if isinstance(value, Mapping):
        return _text_length(value.get("text", "")) + _text_length(value.get("content", ""))
    if isinstance(value, int):
        return CHARS_PER_TOKEN  # a token id
    return 0


def estimate_prompt_tokens(body: Mapping) -> int:
    """Prompt tokens guessed from text length (characters / 4, at least 1; chat adds per-message overhead)."""
    if "messages" in body:
        messages = body.get("messages")
        chars = _text_length(messages)
        if body.get("tools"):
            chars += len(str(body.get("tools")))
        count = len(messages) if isinstance(messages, list) else 0
        return max(1, math.ceil(chars / CHARS_PER_TOKEN)) + MESSAGE_OVERHEAD * count + REPLY_PRIMING
    elif "prompt" in body:
        chars = _text_length(body.get("prompt"))
    else:
        chars = _text_length(body.get("input"))
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


def estimate_completion_tokens(body: Mapping, embeddings: bool) -> int:
    """Completion tokens to reserve: max_tokens (or max_completion_tokens, or the default) times n; 0 for embeddings."""
    if embeddings:
        return 0
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        limit = DEFAULT_MAX_TOKENS
    n = body.get("n")
    n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    return limit * n


def cost_of(route: ModelRoute, prompt_tokens: int, completion_tokens: int) -> float:
    """Cost in the cluster's currency from the model's per-million prices (0.0 when free)."""
    cost = 0.0
    if route.prompt_price_per_million:
        cost += prompt_tokens * route.prompt_price_per_million / 1e6
    if route.completion_price_per_million:
        cost += completion_tokens * route.completion_price_per_million / 1e6
    return cost


def ratelimit_headers(headroom) -> list[tuple[bytes, bytes]]:
    """`x-ratelimit-{limit,remaining,reset}-{requests,tokens}` from a store Headroom (no header where no limit)."""
    headers: list[tuple[bytes, bytes]] = []
    if headroom is None:
        return headers
    for kind in ("requests", "tokens"):
        allowance = getattr(headroom, kind, None)
        if allowance is None:
            continue
        headers.append((f"x-ratelimit-limit-{kind}".encode(), str(int(allowance.limit)).encode()))
        headers.append((f"x-ratelimit-remaining-{kind}".encode(), str(max(0, int(allowance.remaining))).encode()))
        headers.append((f"x-ratelimit-reset-{kind}".encode(), f"{max(0.0, allowance.reset_seconds):.0f}s".encode()))
    return headers

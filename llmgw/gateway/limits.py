"""How many tokens a request may generate, so that what is reserved is what the engine is held to.

Pure functions over a body that `validation.validate_request` accepted. The completion tokens reserved before a
request runs are `per_choice` × `choices`:

- `per_choice`: `max_completion_tokens` when given, else `max_tokens` (OpenAI documents `max_completion_tokens` as
  the newer name that supersedes `max_tokens`); when the request sets neither: the model's context size when its
  route knows it (`ModelRoute.context_size`: the engine stops when its context is full), else DEFAULT_MAX_TOKENS
  (accounting's default);
- `choices`: `n` (default 1), or `best_of` when larger (completions: the engine generates `best_of` candidates).

When a token or budget limit applies to the project, an engine must not generate more than that: an absent
`max_tokens` means "until the context is full" to llama-server and vLLM. So the engine is sent `max_tokens` =
`per_choice` (`enforced_fields`), unless `per_choice` is the engine's context (it cannot generate more), while
`max_completion_tokens` and `n` pass as the client sent them (they are what was reserved).

Why the whole context per choice and not the context minus the prompt's bound: the bound is above the prompt's real
count (bytes, not tokens), and the engine generates up to the context minus the real count; reserving the context
minus the bound would let the completion pass what was held (and, at a completion price above the prompt price, the
cost pass its reservation). Settled with the engine's usage, the extra holds nothing once the request ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.gateway.accounting import DEFAULT_MAX_TOKENS
from llmgw.routes import ProjectPolicy


@dataclass(frozen=True)
class CompletionLimit:
    """Tokens one request may generate: `per_choice` for each of `choices` (0 × 1 for embeddings).

    `by_context`: `per_choice` is the engine's context size (the request set no max tokens), which holds the engine
    without sending it `max_tokens`.
    """

    per_choice: int
    choices: int
    by_context: bool = False

    @property
    def total(self) -> int:
        return self.per_choice * self.choices


def _integer(value) -> int | None:
    """A validated JSON integer (JSON Schema counts 40.0 as one) as an int; None when absent or null."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    return value if isinstance(value, int) else None


def completion_limit(body: Mapping, embeddings: bool, context_size: int | None = None) -> CompletionLimit:
    """The completion tokens a validated request may generate (see the module docstring). `context_size`: the
    model's engine context in tokens (`ModelRoute.context_size`; None: unknown)."""
    if embeddings:
        return CompletionLimit(0, 1)
    choices = max(_integer(body.get("n")) or 1, _integer(body.get("best_of")) or 1)
    per_choice = _integer(body.get("max_completion_tokens"))
    if per_choice is None:
        per_choice = _integer(body.get("max_tokens"))
    if per_choice is None:
        if context_size:
            return CompletionLimit(context_size, choices, by_context=True)
        per_choice = DEFAULT_MAX_TOKENS
    return CompletionLimit(max(0, per_choice), choices)


def limits_tokens(policy: ProjectPolicy) -> bool:
    """Whether any scope of the project's quota chain limits tokens or budget (then the engine is held to the
    reservation)."""
    return any(limits.tokens_per_minute is not None or limits.tokens_per_day is not None or limits.budget is not None
               for _scope, limits in policy.quotas)


def enforced_fields(body: Mapping, limit: CompletionLimit, embeddings: bool) -> dict:
    """Top-level fields to set in the forwarded body so the engine generates at most `limit` (empty: none needed,
    also when the engine's context holds it, `limit.by_context`)."""
    if embeddings or limit.by_context or body.get("max_tokens") == limit.per_choice and not isinstance(body.get("max_tokens"), float):
        return {}
    return {"max_tokens": limit.per_choice}

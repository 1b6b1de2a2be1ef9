"""How many tokens a request may generate, so that what is reserved is what the engine is held to.

Pure functions over a body that `validation.validate_request` accepted. The completion tokens reserved before a
request runs are `per_choice` × `choices`:

- `per_choice`: `max_completion_tokens` when given, else `max_tokens`, else DEFAULT_MAX_TOKENS (accounting's
  default; OpenAI documents `max_completion_tokens` as the newer name that supersedes `max_tokens`);
- `choices`: `n` (default 1), or `best_of` when larger (completions: the engine generates `best_of` candidates).

When a token or budget limit applies to the project, an engine must not generate more than that: an absent
`max_tokens` means "until the context is full" to llama-server and vLLM. So the engine is sent `max_tokens` =
`per_choice` (`enforced_fields`), while `max_completion_tokens` and `n` pass as the client sent them (they are what
was reserved).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from llmgw.gateway.accounting import DEFAULT_MAX_TOKENS
from llmgw.routes import ProjectPolicy


@dataclass(frozen=True)
class CompletionLimit:
    """Tokens one request may generate: `per_choice` for each of `choices` (0 × 1 for embeddings)."""

    per_choice: int
    choices: int

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


def completion_limit(body: Mapping, embeddings: bool) -> CompletionLimit:
    """The completion tokens a validated request may generate (see the module docstring)."""
    if embeddings:
        return CompletionLimit(0, 1)
    per_choice = _integer(body.get("max_completion_tokens"))
    if per_choice is None:
        per_choice = _integer(body.get("max_tokens"))
    if per_choice is None:
        per_choice = DEFAULT_MAX_TOKENS
    choices = max(_integer(body.get("n")) or 1, _integer(body.get("best_of")) or 1)
    return CompletionLimit(max(0, per_choice), choices)


def limits_tokens(policy: ProjectPolicy) -> bool:
    """Whether any scope of the project's quota chain limits tokens or budget (then the engine is held to the
    reservation)."""
    return any(limits.tokens_per_minute is not None or limits.tokens_per_day is not None or limits.budget is not None
               for _scope, limits in policy.quotas)


def enforced_fields(body: Mapping, limit: CompletionLimit, embeddings: bool) -> dict:
    """Top-level fields to set in the forwarded body so the engine generates at most `limit` (empty: none needed)."""
    if embeddings or body.get("max_tokens") == limit.per_choice and not isinstance(body.get("max_tokens"), float):
        return {}
    return {"max_tokens": limit.per_choice}

"""Exception groups out of trio nurseries, split one way: cancellation is re-raised, never dropped.

trio nurseries raise every failure of their tasks as a `BaseExceptionGroup` (strict exception groups). Code
that turns such a group into one error of its own must not swallow a `trio.Cancelled` that travels in it:
that would leave an outer cancel scope waiting forever. `expect_leaves` is the one helper that does the split,
with `group.split(trio.Cancelled)` first. It imports nothing of llmgw, so every package that runs trio may use it.
"""

from __future__ import annotations

import trio


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside `error`, nested groups flattened, in order; `[error]` when it is not a group."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def expect_leaves(
    group: BaseExceptionGroup,
    kinds: type[BaseException] | tuple[type[BaseException], ...],
) -> list[BaseException]:
    """The leaves of `group` (flattened, in order) when every one is an instance of `kinds`.

    Call it in an `except BaseExceptionGroup as group:` block to turn the group into one error of the caller's.
    Raises: `group` itself (unchanged, so trio's cancel scopes and the caller's callers see it whole) when it
    holds a `trio.Cancelled` (cancellation is re-raised, never dropped) or any leaf not of `kinds` (a bug
    surfaces as itself, not as a reconnect or a message).
    """
    cancelled, rest = group.split(trio.Cancelled)
    if cancelled is not None or rest is None:
        raise group
    _, others = rest.split(kinds)
    if others is not None:
        raise group
    return leaves(rest)

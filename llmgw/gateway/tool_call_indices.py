"""Streamed tool-call deltas get the `index` the OpenAI stream format requires, when a backend leaves it out.

OpenAI's chat stream names each tool call of a choice by `delta.tool_calls[].index` (0, 1, ... in order of
appearance); clients assemble a call's arguments from every delta with the same index (the official Python SDK's
stream helper indexes a list with it and fails on None: `TypeError: list indices must be integers or slices, not
NoneType`). Several OpenAI-compatible servers stream parallel tool calls without it (LiteLLM issue #14579 is the
same class). The rule, per choice (`choices[].index`, 0 when absent):

- an `index` the backend sent (an int) is kept; a call id seen with it keeps that index;
- a delta without `index` but with an `id` gets the index of that id when seen before in this choice (and loses
  the repeated `id`: OpenAI sends it on a call's first delta only, and the SDKs concatenate every string field of
  a call's deltas, so a repeated id would come out doubled), else the next free one (one more than the largest
  given so far in this choice: 0, 1, ...);
- a delta with neither continues the last call of that choice (index 0 when it is the choice's first).

Only chunks whose bytes contain `"tool_calls"` reach this (the relay's byte check); others are not parsed.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _ChoiceCalls:
    """One choice's calls so far: call id -> index, the last index given, the next free index."""

    by_id: dict[str, int] = field(default_factory=dict)
    last: int | None = None
    next_free: int = 0


class ToolCallIndexer:
    """Fill in missing `index` fields of streamed tool-call deltas, one instance per stream (module docstring).

    `index_chunk(chunk)` edits a parsed chat.completion.chunk in place and returns True when it changed anything.
    """

    def __init__(self) -> None:
        self._choices: dict[int, _ChoiceCalls] = {}

    def index_chunk(self, chunk: dict) -> bool:
        """Give every tool-call delta of `chunk` (a parsed chunk; not a dict or no choices: nothing) an index."""
        changed = False
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return False
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            if not isinstance(calls, list):
                continue
            number = choice.get("index")
            state = self._choices.setdefault(number if isinstance(number, int) else 0, _ChoiceCalls())
            for call in calls:
                if isinstance(call, dict):
                    changed |= _index_call(state, call)
        return changed


def _index_call(state: _ChoiceCalls, call: dict) -> bool:
    """Index one tool-call delta against its choice's `state`; True when `index` was written."""
    call_id = call.get("id")
    given = call.get("index")
    if isinstance(given, int) and not isinstance(given, bool):
        index, changed = given, False
    elif isinstance(call_id, str) and call_id in state.by_id:
        index, changed = state.by_id[call_id], True
        del call["id"]  # clients concatenate string fields of deltas: a repeated id would be doubled
    elif isinstance(call_id, str) and call_id:
        index, changed = state.next_free, True
    else:
        index, changed = (state.last if state.last is not None else state.next_free), True
    if isinstance(call_id, str) and call_id:
        state.by_id.setdefault(call_id, index)
    state.last = index
    state.next_free = max(state.next_free, index + 1)
    if changed:
        call["index"] = index
    return changed

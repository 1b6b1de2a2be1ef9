"""The gateway's accounting: its calls into the store (`Accounting`), estimating a request's tokens and cost
before it runs, and the `x-ratelimit-*` headers.

`Accounting` runs every store call that may wait off the event loop (a SQLite write that need not wait runs on it,
`llmgw.store.boundary`) and every usage record through the durable spool: a store that is locked, slow or down
costs a request its admission (503 with Retry-After) only when the request needs the store to be admitted, never
an answer or a usage record.

Reserved before admitting: the prompt's bound (`token_bounds.prompt_token_bound`, never below the engine's count)
plus the completion tokens the request may generate, at the model's prompt and completion prices. The estimate
here (`estimate_prompt_tokens`, the prompt tokens billed when the engine's usage never came): prompt characters / 4 (chat: the text of every message plus
MESSAGE_OVERHEAD tokens per message and REPLY_PRIMING for the reply's header, as chat templates add them;
completions: the prompt; embeddings: the input) plus the completion tokens the request may generate
(`limits.completion_limit`: `max_completion_tokens` or `max_tokens`; when the request sets none, the model's
context size, or DEFAULT_MAX_TOKENS when the route does not know it; times `n` or `best_of`). Settled later with
the engine's own usage. Costs use the model's prices per million tokens (None = free).
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import trio

from llmgw.errors import LlmgwError, StoreError, TemporaryError, UsageError
from llmgw.gateway.problems import ApiError, unavailable
from llmgw.routes import ModelRoute
from llmgw.store import KeyCheck, Rejection, Reservation, Settlement, UsageRecord, charged
from llmgw.store.boundary import DEFAULT_SETTLE_WAIT, DEFAULT_THREADS, StoreBoundary
from llmgw.store.spool import UsageSpool

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


STORE_RETRY_SECONDS = 2.0


def new_request_id() -> str:
    """A gateway request's id: "req_" + 32 hex digits (128 random bits), unique, so it keys the request's usage
    record (`Settlement.entry_id`). os.urandom rather than uuid4: about 2 us instead of 9 us per request here."""
    return "req_" + os.urandom(16).hex()


def store_unavailable(what: str, error: LlmgwError) -> ApiError:
    """The 503 a request gets when the store cannot admit it: OpenAI's error object, `Retry-After` from the error's
    delay (at least STORE_RETRY_SECONDS)."""
    delay = max(STORE_RETRY_SECONDS, getattr(error, "delay", 0.0) or 0.0)
    return unavailable(f"The gateway cannot {what} right now because its store is unavailable; retry in "
                       f"{delay:.0f} s.", "store_unavailable", delay)


def _settlement(reservation: Reservation | None, actual_tokens: int | None, actual_cost: float, record: UsageRecord,
                request_id: str | None) -> Settlement:
    return Settlement(
        entry_id=request_id or "stl_" + uuid.uuid4().hex, time=record.time,
        reservation_id=reservation.reservation_id if reservation is not None else None,
        has_slots=bool(reservation is not None and reservation.slots),
        actual_tokens=actual_tokens, actual_cost=actual_cost, usage=record, charges=charged(reservation))


class Accounting:
    """The gateway's calls into the store, through a `StoreBoundary` (worker threads and the usage spool).

    `store`: an `llmgw.store.Store`. `spool_dir`: where the usage spool lives (None: beside a SQLite store's
    file, `<name>.spool/`; a store without a file, such as PostgreSQL, needs one). `settle_wait`: seconds a
    request waits, before its answer ends, for the store to commit its usage (then it is left in the spool).
    Raises UsageError when no spool directory can be worked out, StoreError when the spool cannot be opened.
    What each method answers when the store fails is in its docstring: a request is refused (503) only when it
    needs the store to be admitted (key check, quota reservation); an answered request's usage is never lost.
    """

    def __init__(self, store, spool_dir: str | Path | None = None, *, settle_wait: float = DEFAULT_SETTLE_WAIT,
                 threads: int = DEFAULT_THREADS):
        if spool_dir is None:
            path = getattr(store, "path", None)
            if path is None:
                raise UsageError("This store has no file to keep the usage spool beside; give the gateway a "
                                 "spool directory under its state directory (spool_dir=...).")
            spool_dir = Path(path).with_name(Path(path).name + ".spool")
        self.store = store
        self.boundary = StoreBoundary(store, UsageSpool(spool_dir), threads=threads, settle_wait=settle_wait)

    async def check_key(self, token: str, now: float) -> KeyCheck:
        """The store's verdict on an API key (a read). Raises ApiError 503 when the store cannot be read."""
        try:
            return await self.boundary.call(self.store.check_api_key, token, now)
        except (TemporaryError, StoreError) as error:
            raise store_unavailable("check API keys", error) from error

    async def reserve(self, scopes, estimated_tokens: int, estimated_cost: float,
                      now: float) -> Reservation | Rejection:
        """Reserve quota (a write). Raises ApiError 503 with Retry-After when the store cannot take it."""
        try:
            return await self.boundary.reserve(scopes, estimated_tokens, estimated_cost, now)
        except (TemporaryError, StoreError) as error:
            raise store_unavailable("check this project's quota", error) from error

    async def renew(self, reservation: Reservation, now: float) -> None:
        """Keep a long request's slots; a store failure is ignored (the next renewal or the slot TTL covers it)."""
        try:
            await self.boundary.call(self.store.renew, reservation, now)
        except (TemporaryError, StoreError) as error:
            self.boundary.last_error = str(error)

    async def settle(self, reservation: Reservation | None, actual_tokens: int | None, actual_cost: float,
                     record: UsageRecord, request_id: str | None = None) -> bool:
        """Record `record` and close `reservation` (settled with `actual_tokens` and `actual_cost`, or released
        when `actual_tokens` is None), through the spool; True when the store committed it at once.
        `request_id`: the request's unique id (`new_request_id`), kept as the record's idempotency id so
        `llmgw usage --request ID` finds it (None: a fresh one).

        Never raises for a store failure: the usage is written, exactly once, when the store answers again, and
        the reservation's concurrency slots are freed then.
        """
        return await self.boundary.settle(_settlement(reservation, actual_tokens, actual_cost, record, request_id))

    def open_entry(self, reservation: Reservation | None, tokens: int, cost: float, record: UsageRecord,
                   request_id: str) -> None:
        """Keep, in the spool, what to bill for request `request_id` if this process dies before it settles:
        `reservation` settled with `tokens` and `cost`, and `record` (`UsageSpool.open_entry`; the settlement of
        the same id supersedes it). One write(2) on the event loop; a spool that cannot be written is noted in
        `boundary.last_error` (the request goes on: only a crash would need the entry)."""
        try:
            self.boundary.spool.open_entry(_settlement(reservation, tokens, cost, record, request_id))
        except StoreError as error:
            self.boundary.last_error = str(error)

    async def release(self, reservation: Reservation) -> None:
        """Free `reservation`'s slots and refund its estimate, through the spool (so a store failure only delays
        it; never raises for one)."""
        await self.boundary.settle(Settlement(
            entry_id="stl_" + uuid.uuid4().hex, time=time.time(), reservation_id=reservation.reservation_id,
            has_slots=bool(reservation.slots), charges=charged(reservation)))

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Write usage left in the spool (by a crash, or while the store was away) until cancelled."""
        await self.boundary.run(task_status=task_status)

    def close(self) -> None:
        """Close the spool (pending usage stays on disk and is written by the next start)."""
        self.boundary.close()

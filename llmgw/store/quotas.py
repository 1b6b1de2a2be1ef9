"""Quota windows, reservations and concurrency slots, enforced inside one store transaction.

Per-minute limits SLIDE: requests and tokens per minute count what was charged in the last minute, kept in
one-second buckets (rows of period "minute" whose `start` is the second, floor(t)); at `now` the buckets from
floor(now) - 60 to floor(now) count, so a charge counts for between 60 and 61 seconds (never less than a minute:
no more than the limit is ever admitted in any 60-second interval, and a refusal comes at most one second early).
A refusal's retry time is when enough of the oldest buckets have left the span for the request to fit. Tokens
per day count in the UTC calendar day, cost against `budget` in the UTC calendar month (fixed windows: they reset
at midnight and on the first). Rows of a pre-sliding store (minute-aligned "minute" rows) read as one bucket each.

A reservation adds one request, the estimated tokens and the estimated cost to every window that has a limit
in every limited scope (the per-minute limits: the bucket of `now`), and takes one concurrency slot in every scope
with `concurrent_requests`. It is all or nothing: the caller runs `reserve` inside a write transaction, the scopes
are locked first (SQLite: the whole file by `BEGIN IMMEDIATE`; PostgreSQL: one row per scope, see `dialects`),
every scope is checked before anything is written, and a rejection writes nothing: exact across gateways and
control planes sharing one store. Settling removes the estimate from the windows it was charged to and adds the
actual tokens and cost to the windows current at settle time, then frees the slots. A slot not freed within its TTL
(a crashed gateway) stops counting and is deleted by `prune`.

The rules are pure functions (`window_bounds`, `decide`, `closing_deltas`), shared by both backends; the
functions taking a `SqlConnection` (already inside a write transaction, except `read_*`) only read and write
rows with the statements of `dialects`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from llmgw.identity import Quota
from llmgw.store.dialects import SqlConnection
from llmgw.store.records import Allowance, Charge, Headroom, LimitUse, Rejection, Reservation

MINUTE = "minute"
DAY = "day"
MONTH = "month"

# limit name -> (period, measure) ; measure "requests" | "tokens" | "cost"; "slots" for concurrency
LIMITS: dict[str, tuple[str, str]] = {
    "requests_per_minute": (MINUTE, "requests"),
    "tokens_per_minute": (MINUTE, "tokens"),
    "tokens_per_day": (DAY, "tokens"),
    "concurrent_requests": ("", "slots"),
    "budget": (MONTH, "cost"),
}

CONCURRENCY_RETRY_SECONDS = 1.0
SLIDING_SPAN = 60
"""Seconds of one-second buckets before the current one that a per-minute limit counts (61 buckets in all)."""


def has_limits(limits: Quota) -> bool:
    """True when at least one of `limits` is set (not None)."""
    return any(getattr(limits, name) is not None for name in LIMITS)


def window_bounds(period: str, now: float) -> tuple[float, float]:
    """The (start, end) in epoch seconds of the row `now` is charged to: for MINUTE the one-second bucket holding
    `now` (the sliding minute counts it until `end + SLIDING_SPAN`), for DAY and MONTH the fixed UTC window."""
    if period == MINUTE:
        start = float(now // 1)
        return start, start + 1.0
    if period == DAY:
        start = float(int(now // 86400) * 86400)
        return start, start + 86400.0
    if period == MONTH:
        moment = datetime.fromtimestamp(now, timezone.utc)
        first = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        following = first.replace(year=first.year + 1, month=1) if first.month == 12 else first.replace(month=first.month + 1)
        return first.timestamp(), following.timestamp()
    raise ValueError(f"unknown quota period {period!r}")


def _periods(limits: Quota) -> list[str]:
    periods = []
    if limits.requests_per_minute is not None or limits.tokens_per_minute is not None:
        periods.append(MINUTE)
    if limits.tokens_per_day is not None:
        periods.append(DAY)
    if limits.budget is not None:
        periods.append(MONTH)
    return periods


@dataclass
class Snapshot:
    """Usage of every limited window and the slot count of the scopes of one request, at `now`.

    `windows` maps (scope, period) to (start, end, (requests, tokens, cost)): the row a reservation now charges
    (for MINUTE the current one-second bucket) and the usage that counts (for MINUTE summed over the sliding
    span); `buckets` maps a scope with a per-minute limit to its counted buckets, start -> (requests, tokens);
    `slots` maps a scope with a concurrency limit to its active slots. Built by `read_snapshot` (SQL) or by hand in
    tests (pure).
    """

    now: float
    windows: dict[tuple[str, str], tuple[float, float, tuple[int, int, float]]] = field(default_factory=dict)
    slots: dict[str, int] = field(default_factory=dict)
    buckets: dict[str, dict[float, tuple[int, int]]] = field(default_factory=dict)

    def used(self, scope: str, limit_name: str) -> tuple[float, float]:
        """(amount used, seconds until it is all gone: the window's end, or for a sliding limit when the newest
        bucket holding any of it leaves the span) of one limit of one scope."""
        period, measure = LIMITS[limit_name]
        if measure == "slots":
            return self.slots[scope], CONCURRENCY_RETRY_SECONDS
        start, end, (requests, tokens, cost) = self.windows[(scope, period)]
        amount = {"requests": requests, "tokens": tokens, "cost": cost}[measure]
        if period != MINUTE:
            return amount, max(0.0, end - self.now)
        held = [second for second, counts in self.buckets.get(scope, {}).items() if counts[measure == "tokens"] > 0]
        return amount, self.leaves(max(held)) if held else 0.0

    def retry_after(self, scope: str, limit_name: str, limit: float, requested: float) -> float:
        """Seconds until `requested` more fits under `limit`, the limit `limit_name` of `scope` (its reset time when
        it never fits, or the limit is not sliding): for a per-minute limit, when enough of the oldest buckets have
        left the sliding span."""
        period, measure = LIMITS[limit_name]
        used, reset = self.used(scope, limit_name)
        if period != MINUTE or requested > limit:
            return reset
        left = used
        for second, counts in sorted(self.buckets.get(scope, {}).items()):
            left -= counts[measure == "tokens"]
            if left + requested <= limit:
                return self.leaves(second)
        return reset

    def leaves(self, second: float) -> float:
        """Seconds until the bucket starting at `second` stops counting (0.0 when it already has)."""
        return max(0.0, second + 1.0 + SLIDING_SPAN - self.now)


def empty_snapshot(scopes: Sequence[tuple[str, Quota]], now: float) -> Snapshot:
    """A snapshot of `scopes` at `now` with every window and slot count at zero (pure)."""
    snapshot = Snapshot(now)
    bounds: dict[str, tuple[float, float]] = {}
    for scope, limits in scopes:
        for period in _periods(limits):
            if period not in bounds:
                bounds[period] = window_bounds(period, now)
            start, end = bounds[period]
            snapshot.windows[(scope, period)] = (start, end, (0, 0, 0.0))
        if limits.concurrent_requests is not None:
            snapshot.slots[scope] = 0
    return snapshot


def read_snapshot(conn: SqlConnection, scopes: Sequence[tuple[str, Quota]], now: float) -> Snapshot:
    """Read the windows and slot counts of `scopes` at `now` (one SELECT for the windows, one per slot scope)."""
    return queue_snapshot(conn, scopes, now)()


def queue_snapshot(conn: SqlConnection, scopes: Sequence[tuple[str, Quota]],
                   now: float) -> Callable[[], Snapshot]:
    """`read_snapshot` in two steps: the statements are run (on a batching connection, queued) now, and the
    returned function reads their rows into the Snapshot. Snapshots queued one after another on a
    `dialects.PostgresBatch` are read in one round trip. One SELECT reads the fixed windows' rows and every
    one-second bucket of the per-minute limits from `floor(now) - SLIDING_SPAN` on (a later one, written by a
    gateway whose clock is ahead, counts too)."""
    snapshot = empty_snapshot(scopes, now)
    counts = {scope: conn.execute("SELECT count(*) FROM quota_slots WHERE scope = ? AND expires_at > ?", (scope, now))
              for scope in snapshot.slots}
    windows = None
    keys = [(scope, period, start) for (scope, period), (start, _e, _u) in snapshot.windows.items() if period != MINUTE]
    sliding = [scope for scope, period in snapshot.windows if period == MINUTE]
    selects, params = [], []
    if keys:
        selects.append("SELECT scope, period, start, requests, tokens, cost FROM quota_windows WHERE "
                       f"(scope, period, start) IN (VALUES {', '.join(['(?, ?, ?)'] * len(keys))})")
        params += [value for key in keys for value in key]
    if sliding:
        selects.append("SELECT scope, period, start, requests, tokens, cost FROM quota_windows WHERE period = ? AND "
                       f"start >= ? AND scope IN ({', '.join(['?'] * len(sliding))})")
        params += [MINUTE, span_start(now), *sliding]
    if selects:
        windows = conn.execute(" UNION ALL ".join(selects), params)

    def read() -> Snapshot:
        for scope, result in counts.items():
            snapshot.slots[scope] = int(result.fetchone()[0])
        if windows is not None:
            for scope, period, second, requests, tokens, cost in windows.fetchall():
                start, end, (had_requests, had_tokens, had_cost) = snapshot.windows[(scope, period)]
                snapshot.windows[(scope, period)] = (start, end, (had_requests + int(requests),
                                                                  had_tokens + int(tokens), had_cost + float(cost)))
                if period == MINUTE:
                    snapshot.buckets.setdefault(scope, {})[float(second)] = (int(requests), int(tokens))
        return snapshot

    return read


def span_start(now: float) -> float:
    """The start of the oldest one-second bucket a per-minute limit counts at `now`."""
    return float(now // 1) - SLIDING_SPAN


def with_reservation(snapshot: Snapshot, reservation: Reservation) -> Snapshot:
    """`snapshot` as it reads once `reservation` (taken in the same transaction after it was read) is written:
    each window it charged counts one more request and its tokens and cost (a per-minute bucket when it is in the
    snapshot's sliding span), each slot scope one more slot. Pure; `snapshot` is left unchanged."""
    windows = dict(snapshot.windows)
    buckets = {scope: dict(seconds) for scope, seconds in snapshot.buckets.items()}
    for charge in reservation.charges:
        entry = windows.get((charge.scope, charge.period))
        if entry is None:
            continue
        if charge.period == MINUTE:
            if charge.start < span_start(snapshot.now):
                continue
            requests, tokens = buckets.setdefault(charge.scope, {}).get(charge.start, (0, 0))
            buckets[charge.scope][charge.start] = (requests + 1, tokens + charge.tokens)
        elif entry[0] != charge.start:
            continue
        start, end, (requests, tokens, cost) = entry
        windows[(charge.scope, charge.period)] = (start, end, (requests + 1, tokens + charge.tokens,
                                                               cost + charge.cost))
    slots = {scope: count + (scope in reservation.slots) for scope, count in snapshot.slots.items()}
    return Snapshot(snapshot.now, windows, slots, buckets)


def _headroom(snapshot: Snapshot, scopes: Sequence[tuple[str, Quota]],
              extra_requests: int = 0, extra_tokens: int = 0) -> Headroom:
    requests: Allowance | None = None
    tokens: Allowance | None = None
    for scope, limits in scopes:
        for name, extra in (("requests_per_minute", extra_requests), ("tokens_per_minute", extra_tokens),
                            ("tokens_per_day", extra_tokens)):
            limit = getattr(limits, name)
            if limit is None:
                continue
            used, reset = snapshot.used(scope, name)
            if extra and name != "tokens_per_day":  # what this reservation adds counts until its bucket leaves
                reset = max(reset, snapshot.leaves(window_bounds(MINUTE, snapshot.now)[0]))
            allowance = Allowance(scope, name, int(limit), max(0, int(limit - used - extra)), reset)
            if name == "requests_per_minute":
                if requests is None or allowance.remaining < requests.remaining:
                    requests = allowance
            elif tokens is None or allowance.remaining < tokens.remaining:
                tokens = allowance
    return Headroom(requests=requests, tokens=tokens)


def read_headroom(conn: SqlConnection, scopes: Sequence[tuple[str, Quota]], now: float) -> Headroom:
    """The tightest request and token allowances of `scopes` at `now` (a read; no transaction needed)."""
    limited = [(scope, limits) for scope, limits in scopes if has_limits(limits)]
    if not limited:
        return Headroom()
    return _headroom(read_snapshot(conn, limited, now), limited)


def read_use(conn: SqlConnection, scopes: Sequence[tuple[str, Quota]], now: float) -> list[LimitUse]:
    """Every limit set in `scopes` and what counts against it at `now`: the snapshot `reserve` reads, each limit
    read by `Snapshot.used` as `decide` reads it (a read; no transaction needed). In `scopes` order, then LIMITS
    order; [] when no scope has a limit."""
    limited = [(scope, limits) for scope, limits in scopes if has_limits(limits)]
    if not limited:
        return []
    snapshot = read_snapshot(conn, limited, now)
    uses = []
    for scope, limits in limited:
        for name in LIMITS:
            if (limit := getattr(limits, name)) is not None:
                used, reset = snapshot.used(scope, name)
                uses.append(LimitUse(scope, name, limit, used, reset))
    return uses


def decide(snapshot: Snapshot, limited: Sequence[tuple[str, Quota]], estimated_tokens: int,
           estimated_cost: float) -> Rejection | list[Charge]:
    """The quota rule, pure: the Rejection of the tightest limit `snapshot` leaves no room in, or the charges to
    write (one per limited window, sorted by window key so that every backend writes rows in one order).

    The Rejection chosen is the one a retry cannot fix first (`exceeds_limit`), then the longest wait.
    """
    failures: list[Rejection] = []
    for scope, limits in limited:
        for name in LIMITS:
            limit = getattr(limits, name)
            if limit is None:
                continue
            requested = {"requests": 1, "slots": 1, "tokens": estimated_tokens, "cost": estimated_cost}[LIMITS[name][1]]
            used, reset = snapshot.used(scope, name)
            if used + requested > limit:
                failures.append(Rejection(scope=scope, limit_name=name, limit=limit, remaining=max(0, limit - used),
                                          requested=requested, reset_seconds=reset,
                                          retry_after_seconds=snapshot.retry_after(scope, name, limit, requested),
                                          exceeds_limit=requested > limit))
    if failures:
        worst = max(failures, key=lambda r: (r.exceeds_limit, r.retry_after_seconds))
        return replace(worst, headroom=_headroom(snapshot, limited))
    return sorted((Charge(scope, period, start, estimated_tokens, estimated_cost if period == MONTH else 0.0)
                   for (scope, period), (start, _end, _usage) in snapshot.windows.items()),
                  key=lambda c: (c.scope, c.period, c.start))


def reserve(conn: SqlConnection, scopes: Sequence[tuple[str, Quota]], estimated_tokens: int,
            estimated_cost: float, now: float, reservation_id: str, slot_ttl: float,
            locked: bool = False, snapshot: Snapshot | None = None) -> Reservation | Rejection:
    """Check every limit of every scope, then charge them all, or charge nothing and return a Rejection.

    Must run inside a write transaction: the scopes are locked first (`SqlConnection.lock_scopes`; `locked`
    True: the caller has locked them in this transaction already), so the check and the charge are atomic
    against every other gateway. Scopes without any limit are skipped and cost no writes. `snapshot`: the limited
    scopes' usage as it stands in this transaction, when the caller has it (`queue_snapshot`, `with_reservation`);
    None: read here.
    """
    limited = [(scope, limits) for scope, limits in scopes if has_limits(limits)]
    if not limited:
        return Reservation(None, (), estimated_tokens, estimated_cost, now)
    if not locked:
        conn.lock_scopes([scope for scope, _limits in limited])
    if snapshot is None:
        snapshot = read_snapshot(conn, limited, now)
    decision = decide(snapshot, limited, estimated_tokens, estimated_cost)
    if isinstance(decision, Rejection):
        return decision
    charges = decision
    _add_to_windows(conn, [(c.scope, c.period, c.start, 1, c.tokens, c.cost) for c in charges])
    slot_scopes = tuple(scope for scope, limits in limited if limits.concurrent_requests is not None)
    if slot_scopes:
        conn.execute(
            "INSERT INTO quota_slots (reservation_id, scope, expires_at) VALUES "
            + ", ".join(["(?, ?, ?)"] * len(slot_scopes)),
            [value for scope in slot_scopes for value in (reservation_id, scope, now + slot_ttl)],
        )
    conn.execute(
        "INSERT INTO quota_reservations (id, created_at, state, estimated_tokens, estimated_cost, charges) "
        "VALUES (?, ?, 'open', ?, ?, ?)",
        (reservation_id, now, estimated_tokens, estimated_cost,
         json.dumps([[c.scope, c.period, c.start, c.tokens, c.cost] for c in charges])),
    )
    return Reservation(reservation_id, tuple(scope for scope, _ in limited), estimated_tokens, estimated_cost, now,
                       headroom=_headroom(snapshot, limited, extra_requests=1, extra_tokens=estimated_tokens),
                       charges=tuple(charges), slots=slot_scopes)


def closing_deltas(charges: Sequence[Sequence], actual: tuple[int, float] | None,
                   now: float) -> list[tuple[str, str, float, int, float]]:
    """The quota rule of settling, pure: (scope, period, start, tokens, cost) to add to each window.

    `charges` are a reservation's [scope, period, start, tokens, cost] as reserved. Each is taken back from the
    window it was charged to; with `actual` = (tokens, cost) the actual usage is added to the window current at
    `now` (a release, `actual` None, only refunds). Windows that do not change are left out; rows are sorted.
    """
    deltas: dict[tuple[str, str, float], list[float]] = {}
    for scope, period, start, tokens, cost in charges:
        entry = deltas.setdefault((scope, period, start), [0, 0.0])
        entry[0] -= tokens
        entry[1] -= cost
        if actual is not None:
            current, _end = window_bounds(period, now)
            entry = deltas.setdefault((scope, period, current), [0, 0.0])
            entry[0] += actual[0]
            entry[1] += actual[1] if period == MONTH else 0.0
    return [(scope, period, start, int(tokens), cost)
            for (scope, period, start), (tokens, cost) in sorted(deltas.items()) if tokens or cost]


def close(conn: SqlConnection, reservation_id: str, actual: tuple[int, float] | None, now: float,
          has_slots: bool = True) -> bool:
    """Settle (`actual` = (tokens, cost)) or release (`actual` None: refund the estimate) one reservation.

    The request itself stays counted in requests per minute. The reservation's row is deleted (a closed
    reservation has no further use; one statement finds and removes it, so two closes cannot both apply).
    Returns False when the reservation was already settled or released (nothing changes: settling is
    idempotent). `has_slots` False (the reservation took no concurrency slot) skips the slot delete. Must run
    inside a write transaction.
    """
    row = conn.execute(
        "DELETE FROM quota_reservations WHERE id = ? AND state = 'open' RETURNING charges", (reservation_id,)
    ).fetchone()
    if has_slots:
        conn.execute("DELETE FROM quota_slots WHERE reservation_id = ?", (reservation_id,))
    if row is None:
        return False
    _add_to_windows(conn, [(scope, period, start, 0, tokens, cost)
                           for scope, period, start, tokens, cost in closing_deltas(json.loads(row[0]), actual, now)])
    return True


_ADD_ON_CONFLICT = (" ON CONFLICT (scope, period, start) DO UPDATE SET requests = quota_windows.requests + "
                    "excluded.requests, tokens = quota_windows.tokens + excluded.tokens, "
                    "cost = quota_windows.cost + excluded.cost")


def _add_to_windows(conn: SqlConnection, rows: list[tuple[str, str, float, int, int, float]]) -> None:
    """Add (requests, tokens, cost) to the windows (scope, period, start) of `rows`, creating missing ones: one
    statement for all rows (keys distinct, sorted by the callers so that every transaction locks rows in one order)."""
    if rows:
        conn.execute(
            "INSERT INTO quota_windows (scope, period, start, requests, tokens, cost) VALUES "
            + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(rows)) + _ADD_ON_CONFLICT,
            [value for row in rows for value in row],
        )


def close_charged(conn: SqlConnection, closes: Sequence[tuple[str, Sequence[Sequence], tuple[int, float] | None,
                                                         float, bool]]) -> None:
    """`close` of several reservations in one statement, when the caller knows each one's charges (as reserved) and
    the backend runs data-modifying WITH (PostgreSQL only; SQLite has no such statement).

    `closes`: (reservation_id, charges, actual, now, has_slots) per reservation, as `close` takes them, each
    reservation id once. The reservation rows are deleted, the slots of those with `has_slots` freed, and the
    windows changed by the `closing_deltas` of each reservation whose row was still open (summed per window, the
    windows written in the order of `_add_to_windows`: code points, "C" collation, so that neither two such statements nor
    one and a reservation deadlock), so a second close of the same
    reservation changes nothing, as with `close`. Nothing is read back: the statement goes with the transaction's
    others (one round trip, `dialects.PostgresBatch`). Must run inside a write transaction.
    Format: https://www.postgresql.org/docs/15/queries-with.html#QUERIES-WITH-MODIFYING.
    """
    if not closes:
        return
    ids = [reservation_id for reservation_id, _charges, _actual, _now, _slots in closes]
    with_slots = [reservation_id for reservation_id, _charges, _actual, _now, has_slots in closes if has_slots]
    rows = [(reservation_id, scope, period, float(start), tokens, float(cost))
            for reservation_id, charges, actual, now, _slots in closes
            for scope, period, start, tokens, cost in closing_deltas(charges, actual, now)]
    sql = ("WITH closed AS (DELETE FROM quota_reservations WHERE id IN (" + ", ".join(["?"] * len(ids))
           + ") AND state = 'open' RETURNING id)")
    params: list = list(ids)
    if with_slots:
        sql += ", freed AS (DELETE FROM quota_slots WHERE reservation_id IN (" + ", ".join(["?"] * len(with_slots)) + "))"
        params += with_slots
    if rows:
        sql += (" INSERT INTO quota_windows (scope, period, start, requests, tokens, cost) SELECT scope, period, start, 0, "
                "sum(tokens), sum(cost) FROM (VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(rows))
                + ") AS v (id, scope, period, start, tokens, cost) WHERE id IN (SELECT id FROM closed) "
                "GROUP BY scope, period, start ORDER BY scope COLLATE \"C\", period COLLATE \"C\", start" + _ADD_ON_CONFLICT)
        params += [value for row in rows for value in row]
    else:
        sql += " SELECT count(*) FROM closed"
    conn.execute(sql, params)


def renew(conn: SqlConnection, reservation_id: str, now: float, slot_ttl: float) -> int:
    """Push the expiry of a reservation's slots to `now + slot_ttl`; returns how many slots it still holds."""
    return len(conn.execute("UPDATE quota_slots SET expires_at = ? WHERE reservation_id = ? RETURNING scope",
                            (now + slot_ttl, reservation_id)).fetchall())


def prune(conn: SqlConnection, now: float) -> None:
    """Delete expired slots, windows that can no longer count, and closed or stale reservations.

    Per-minute buckets are kept 2 minutes, day windows 2 days, month windows 62 days; reservations left open (a
    crashed gateway) 2 days (closed ones are deleted when closed, so this scans only the few open ones).
    """
    conn.execute("DELETE FROM quota_slots WHERE expires_at <= ?", (now,))
    conn.execute("DELETE FROM quota_windows WHERE period = ? AND start < ?", (MINUTE, span_start(now) - 60))
    conn.execute("DELETE FROM quota_windows WHERE period = ? AND start < ?", (DAY, now - 2 * 86400))
    conn.execute("DELETE FROM quota_windows WHERE period = ? AND start < ?", (MONTH, now - 62 * 86400))
    conn.execute("DELETE FROM quota_reservations WHERE created_at < ?", (now - 2 * 86400,))

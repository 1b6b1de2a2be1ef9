"""Usage records: one row per request the gateway answered, and the summaries `llmgw usage` prints.

Functions taking a connection run inside the caller's transaction (`insert_usage`) or as a plain read.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.errors import UsageError
from llmgw.store.dialects import SqlConnection
from llmgw.store.records import PairUsage, UsageLoad, UsageRecord, UsageRow

GROUPINGS = ("model", "project", "day")

_GROUP_COLUMNS = {"model": "model", "project": "project"}


def _values(record: UsageRecord, request_id: str | None) -> tuple:
    return (record.time, record.project, record.key_id, record.model, record.replica, record.node,
            int(record.prompt_tokens), int(record.completion_tokens), int(record.cached_tokens),
            record.ttft_seconds, float(record.duration_seconds), int(record.status), float(record.cost), request_id,
            record.client_request_id, record.settings_commit, record.trace_id, record.batch_id)


_INSERT = ("INSERT INTO usage (time, project, key_id, model, replica, node, prompt_tokens, completion_tokens, "
           "cached_tokens, ttft_seconds, duration_seconds, status, cost, request_id, client_request_id, "
           "settings_commit, trace_id, batch_id) VALUES ")
_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"


def insert_usage(conn: SqlConnection, record: UsageRecord, request_id: str | None = None):
    """Append `record` to the usage table, unless a row with `request_id` is there already.

    `request_id` is the record's idempotency id (a spool entry's id): the same id is written at most once.
    None: no deduplication. Returns the statement's result, not yet read: its `fetchone()` is None when nothing
    was written (reading it waits for the database; a caller that does not need to know never reads it).
    """
    return conn.execute(_INSERT + _ROW + " ON CONFLICT (request_id) DO NOTHING RETURNING id",
                        _values(record, request_id))


def insert_usage_many(conn: SqlConnection, records: list[tuple[UsageRecord, str]]):
    """Append each (record, request_id) of `records` (one statement; request ids distinct) whose request id is not
    in the table yet. Returns the statement's result, not yet read: `fetchall()` gives one (request_id,) row per
    record written."""
    return conn.execute(_INSERT + ", ".join([_ROW] * len(records))
                        + " ON CONFLICT (request_id) DO NOTHING RETURNING request_id",
                        [value for record, request_id in records for value in _values(record, request_id)])


# the columns of a UsageRecord, in its fields' order
_RECORD_COLUMNS = ("project, model, time, key_id, replica, node, prompt_tokens, completion_tokens, cached_tokens, "
                   "ttft_seconds, duration_seconds, status, cost, client_request_id, settings_commit, trace_id, batch_id")


def _filter(project: str | Sequence[str] | None, since: float | None,
            model: str | None = None) -> tuple[str, list]:
    """The WHERE clause (possibly "") and its parameters selecting one project's records (or those of several: a
    sequence of names, empty selecting none), those since a time and those of one model."""
    where, params = [], []
    if model is not None:
        where.append("model = ?")
        params.append(model)
    if isinstance(project, str):
        where.append("project = ?")
        params.append(project)
    elif project is not None:
        where.append(f"project IN ({', '.join('?' * len(project))})" if project else "1 = 0")
        params.extend(project)
    if since is not None:
        where.append("time >= ?")
        params.append(since)
    return (f"WHERE {' AND '.join(where)}" if where else ""), params


def query_usage(conn: SqlConnection, project: str | Sequence[str] | None, since: float | None,
                by: str, model: str | None = None) -> list[UsageRow]:
    """Sum usage per model, project or UTC day ("YYYY-MM-DD"), optionally for one project (or several: a sequence of
    names), since a time and of one model.

    Rows are ordered by group name (days therefore oldest first). Raises UsageError for an unknown `by`.
    """
    if by not in GROUPINGS:
        raise UsageError(f"Cannot group usage by {by!r}; use one of: {', '.join(GROUPINGS)}.")
    clause, params = _filter(project, since, model)
    group = conn.day_expression if by == "day" else _GROUP_COLUMNS[by]
    rows = conn.execute(
        f"SELECT {group} AS grp, count(*), sum(CASE WHEN status >= 400 THEN 1 ELSE 0 END), sum(prompt_tokens), "
        f"sum(completion_tokens), sum(cached_tokens), sum(cost), avg(ttft_seconds), avg(duration_seconds) "
        f"FROM usage {clause} GROUP BY grp ORDER BY grp",
        params,
    ).fetchall()
    # PostgreSQL sums integers as numeric (Decimal): every number is made a plain int or float
    return [UsageRow(group=str(r[0]), requests=int(r[1]), errors=int(r[2] or 0), prompt_tokens=int(r[3] or 0),
                     completion_tokens=int(r[4] or 0), cached_tokens=int(r[5] or 0), cost=float(r[6] or 0.0),
                     mean_ttft_seconds=None if r[7] is None else float(r[7]),
                     mean_duration_seconds=None if r[8] is None else float(r[8])) for r in rows]


def list_usage(conn: SqlConnection, project: str | None, since: float | None, limit: int) -> list[UsageRecord]:
    """The latest `limit` usage records, newest first (of `project` and since `since`, when given)."""
    clause, params = _filter(project, since)
    rows = conn.execute(
        f"SELECT {_RECORD_COLUMNS} FROM usage {clause} ORDER BY time DESC, id DESC LIMIT ?", (*params, limit),
    ).fetchall()
    return [UsageRecord(*row) for row in rows]


def usage_of_replica(conn: SqlConnection, model: str, replica: str, settings_commit: str, since: float,
                     limit: int) -> list[UsageRecord]:
    """The records of `model`'s requests answered by `replica` started from `settings_commit` since `since` (unix
    seconds), newest first, at most `limit`."""
    rows = conn.execute(
        f"SELECT {_RECORD_COLUMNS} FROM usage WHERE model = ? AND replica = ? AND settings_commit = ? AND time >= ? "
        "ORDER BY time DESC, id DESC LIMIT ?", (model, replica, settings_commit, since, limit),
    ).fetchall()
    return [UsageRecord(*row) for row in rows]


def ttfts_of_model(conn: SqlConnection, model: str, since: float, limit: int) -> list[float]:
    """The times to first token (seconds; a request answered without streaming: its duration) of `model`'s
    successful requests since `since` (unix seconds), batch lines left out, newest first, at most `limit`."""
    rows = conn.execute(
        "SELECT COALESCE(ttft_seconds, duration_seconds) FROM usage WHERE time >= ? AND model = ? AND status < 400 "
        "AND batch_id IS NULL ORDER BY time DESC LIMIT ?", (since, model, limit),
    ).fetchall()
    return [float(row[0]) for row in rows]


def usage_of_request(conn: SqlConnection, request_id: str) -> UsageRecord | None:
    """The usage record the gateway wrote for request `request_id` (the `x-request-id` it answered with, used as
    the record's idempotency id), or None when there is none (an unknown id, or one still in a gateway's spool)."""
    row = conn.execute(f"SELECT {_RECORD_COLUMNS} FROM usage WHERE request_id = ?", (request_id,)).fetchone()
    return None if row is None else UsageRecord(*row)


def usage_of_client_request(conn: SqlConnection, client_request_id: str, limit: int) -> list[tuple[str, UsageRecord]]:
    """The records of the requests whose client sent `x-request-id: <client_request_id>` (a client may reuse an
    id), newest first, at most `limit`: (the gateway's own id of the request, its record)."""
    rows = conn.execute(
        f"SELECT request_id, {_RECORD_COLUMNS} FROM usage WHERE client_request_id = ? ORDER BY time DESC, id DESC "
        "LIMIT ?", (client_request_id, limit),
    ).fetchall()
    return [(row[0], UsageRecord(*row[1:])) for row in rows]


def usage_load(conn: SqlConnection, since: float, ttft_limit: int) -> UsageLoad:
    """The load of the records since `since` (unix seconds): per (model, project) sums, each model's busiest clock
    hour, and the TTFTs of each model's latest `ttft_limit` requests that have one (`UsageLoad`)."""
    rows = conn.execute(
        "SELECT model, project, count(*), sum(CASE WHEN status >= 400 THEN 1 ELSE 0 END), sum(prompt_tokens), "
        "sum(completion_tokens) FROM usage WHERE time >= ? GROUP BY model, project ORDER BY model, project",
        (since,)).fetchall()
    pairs = tuple(PairUsage(str(r[0]), str(r[1]), int(r[2]), int(r[3] or 0), int(r[4] or 0), int(r[5] or 0))
                  for r in rows)
    busiest: dict[str, int] = {}
    for model, _hour, count in conn.execute(
            f"SELECT model, {conn.hour_expression} AS hr, count(*) FROM usage WHERE time >= ? GROUP BY model, hr",
            (since,)).fetchall():
        busiest[str(model)] = max(busiest.get(str(model), 0), int(count))
    ttfts = {}
    for model in sorted(busiest):
        found = conn.execute(
            "SELECT ttft_seconds FROM usage WHERE model = ? AND time >= ? AND ttft_seconds IS NOT NULL "
            "ORDER BY time DESC LIMIT ?", (model, since, ttft_limit)).fetchall()
        if found:
            ttfts[model] = tuple(float(r[0]) for r in found)
    return UsageLoad(pairs, busiest, ttfts)

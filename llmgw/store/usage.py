"""Usage records: one row per request the gateway answered, and the summaries `llmgw usage` prints.

Functions taking a connection run inside the caller's transaction (`insert_usage`) or as a plain read.
"""

from __future__ import annotations

import sqlite3

from llmgw.errors import UsageError
from llmgw.store.records import UsageRecord, UsageRow

GROUPINGS = ("model", "project", "day")

_GROUP_EXPRESSIONS = {
    "model": "model",
    "project": "project",
    "day": "strftime('%Y-%m-%d', time, 'unixepoch')",
}


def insert_usage(conn: sqlite3.Connection, record: UsageRecord) -> None:
    """Append `record` to the usage table."""
    conn.execute(
        "INSERT INTO usage (time, project, key_id, model, replica, node, prompt_tokens, completion_tokens, "
        "cached_tokens, ttft_seconds, duration_seconds, status, cost) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (record.time, record.project, record.key_id, record.model, record.replica, record.node,
         int(record.prompt_tokens), int(record.completion_tokens), int(record.cached_tokens),
         record.ttft_seconds, float(record.duration_seconds), int(record.status), float(record.cost)),
    )


def _filter(project: str | None, since: float | None) -> tuple[str, list]:
    """The WHERE clause (possibly "") and its parameters selecting one project's records and those since a time."""
    where, params = [], []
    if project is not None:
        where.append("project = ?")
        params.append(project)
    if since is not None:
        where.append("time >= ?")
        params.append(since)
    return (f"WHERE {' AND '.join(where)}" if where else ""), params


def query_usage(conn: sqlite3.Connection, project: str | None, since: float | None, by: str) -> list[UsageRow]:
    """Sum usage per model, project or UTC day ("YYYY-MM-DD"), optionally for one project and since a time.

    Rows are ordered by group name (days therefore oldest first). Raises UsageError for an unknown `by`.
    """
    if by not in _GROUP_EXPRESSIONS:
        raise UsageError(f"Cannot group usage by {by!r}; use one of: {', '.join(GROUPINGS)}.")
    clause, params = _filter(project, since)
    group = _GROUP_EXPRESSIONS[by]
    rows = conn.execute(
        f"SELECT {group} AS grp, count(*), sum(status >= 400), sum(prompt_tokens), sum(completion_tokens), "
        f"sum(cached_tokens), sum(cost), avg(ttft_seconds), avg(duration_seconds) "
        f"FROM usage {clause} GROUP BY grp ORDER BY grp",
        params,
    ).fetchall()
    return [UsageRow(group=str(r[0]), requests=r[1], errors=r[2] or 0, prompt_tokens=r[3] or 0,
                     completion_tokens=r[4] or 0, cached_tokens=r[5] or 0, cost=float(r[6] or 0.0),
                     mean_ttft_seconds=r[7], mean_duration_seconds=r[8]) for r in rows]


def list_usage(conn: sqlite3.Connection, project: str | None, since: float | None, limit: int) -> list[UsageRecord]:
    """The latest `limit` usage records, newest first (of `project` and since `since`, when given)."""
    clause, params = _filter(project, since)
    rows = conn.execute(
        "SELECT project, model, time, key_id, replica, node, prompt_tokens, completion_tokens, cached_tokens, "
        f"ttft_seconds, duration_seconds, status, cost FROM usage {clause} ORDER BY time DESC, id DESC LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [UsageRecord(*row) for row in rows]

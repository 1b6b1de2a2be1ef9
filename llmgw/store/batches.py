"""The batches of `/v1/batches` and their lines: what a control plane needs to run a batch, resume it after a restart
or a failover, and never run a line twice nor lose one.

Two tables (SQLite migration 10, PostgreSQL 8): `batches`, one row per batch (its id, "batch_" + 32 hex digits, the
project and API key that made it, its status, when it was made and until when it is kept, and `body`: JSON of the
Batch object as OpenAI's API describes it, without `status` and `request_counts`, which come from the columns), and
`batch_lines`, one row per line of its input file: `state` is "pending" (not run yet), "running" (claimed by one
control plane, `claimed_by`, at `claimed_at`), "completed" or "failed" (`result`: the output or error line, JSON).

A line is claimed in one statement (`claim`: the lowest pending line becomes "running" for its holder) and finished
in one (`finish`, only by the holder that claimed it), so two control planes never run the same line. Before its
request leaves, the holder writes the replica it goes to (`send`: `sent_to`, SQLite migration 12, PostgreSQL 10; only
while the line is still its own). A line "running" for a holder that is gone (a control plane that was killed) is
handed back by `requeue` when another takes the batch over, keeping `sent_to`: the next holder sends it to that same
replica again, whose engine relay ran the first request and keeps its answer for the same key (the line's request
id, `llmgw.engines.relay_once`), so the engine runs it once (docs/gateway.md).
`request_counts` are counted from the lines each time a batch is read. Functions taking a connection run inside the
caller's transaction. The lines are prompts and answers: nothing here writes them to a log.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmgw.store.dialects import SqlConnection

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
"""The statuses of a batch a runner still has work on."""
DONE = ("completed", "failed", "expired", "cancelled")
"""The statuses a batch ends in."""

_COLUMNS = "id, project, key_id, status, created_at, kept_until, body"


@dataclass(frozen=True)
class LineCounts:
    """A batch's lines: `total`, `completed` (answered 2xx), `failed` (an error line), `running` (claimed now)."""

    total: int = 0
    completed: int = 0
    failed: int = 0
    running: int = 0

    @property
    def pending(self) -> int:
        return self.total - self.completed - self.failed - self.running


@dataclass(frozen=True)
class BatchRecord:
    """One batch: `body` the Batch object's other fields (endpoint, input_file_id, timestamps, metadata, output and
    error file ids, errors); `counts` its lines as counted when read (empty for a record not read from the store).
    Times in epoch seconds."""

    id: str
    project: str
    key_id: str | None
    status: str
    created_at: float
    kept_until: float
    body: dict[str, Any]
    counts: LineCounts = field(default_factory=LineCounts)


@dataclass(frozen=True)
class BatchLine:
    """One line of a batch's input: its number (0-based), `custom_id` (None when the line had none), the line's text;
    `state` and `result` (the output or error line; None until finished); `sent_to` the replica id its request was
    sent to by a holder before (None: never sent)."""

    line: int
    custom_id: str | None
    request: str
    state: str = "pending"
    result: str | None = None
    sent_to: str | None = None


def _counts(conn: SqlConnection, batch_id: str) -> LineCounts:
    rows = conn.execute("SELECT state, count(*) FROM batch_lines WHERE batch_id = ? GROUP BY state",
                        (batch_id,)).fetchall()
    by = {state: int(count) for state, count in rows}
    return LineCounts(total=sum(by.values()), completed=by.get("completed", 0), failed=by.get("failed", 0),
                      running=by.get("running", 0))


def _record(conn: SqlConnection, row) -> BatchRecord:
    return BatchRecord(row[0], row[1], row[2], row[3], float(row[4]), float(row[5]), json.loads(row[6]),
                       _counts(conn, row[0]))


def insert(conn: SqlConnection, record: BatchRecord, lines: Sequence[BatchLine]) -> None:
    """Write a new batch and its lines (all pending unless a line says otherwise: a malformed one is failed at once)."""
    conn.execute(f"INSERT INTO batches ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                 (record.id, record.project, record.key_id, record.status, record.created_at, record.kept_until,
                  json.dumps(record.body, separators=(",", ":"))))
    for line in lines:
        conn.execute("INSERT INTO batch_lines (batch_id, line, state, custom_id, request, result) "
                     "VALUES (?, ?, ?, ?, ?, ?)",
                     (record.id, line.line, line.state, line.custom_id, line.request, line.result))


def find(conn: SqlConnection, batch_id: str, project: str | None, now: float) -> BatchRecord | None:
    """The batch `batch_id` of `project` (None: any project) while kept at `now`, its lines counted; None otherwise."""
    sql, params = f"SELECT {_COLUMNS} FROM batches WHERE id = ? AND kept_until > ?", [batch_id, now]
    if project is not None:
        sql, params = sql + " AND project = ?", [*params, project]
    row = conn.execute(sql, params).fetchone()
    return None if row is None else _record(conn, row)


def listed(conn: SqlConnection, project: str, after: str | None, limit: int, now: float) -> list[BatchRecord]:
    """Up to `limit` kept batches of `project`, newest first, starting after the batch `after` (unknown: at the top)."""
    where, params = ["project = ?", "kept_until > ?"], [project, now]
    if after is not None:
        mark = conn.execute("SELECT created_at, id FROM batches WHERE id = ? AND project = ?",
                            (after, project)).fetchone()
        if mark is not None:
            where.append("(created_at, id) < (?, ?)")
            params.extend([mark[0], mark[1]])
    rows = conn.execute(f"SELECT {_COLUMNS} FROM batches WHERE {' AND '.join(where)} "
                        "ORDER BY created_at DESC, id DESC LIMIT ?", (*params, limit)).fetchall()
    return [_record(conn, row) for row in rows]


def active(conn: SqlConnection) -> list[BatchRecord]:
    """Every batch a runner still has work on (status in ACTIVE), oldest first."""
    rows = conn.execute(f"SELECT {_COLUMNS} FROM batches WHERE status IN (?, ?, ?, ?) ORDER BY created_at, id",
                        ACTIVE).fetchall()
    return [_record(conn, row) for row in rows]


def update(conn: SqlConnection, batch_id: str, expected: Sequence[str], status: str, body: dict[str, Any]) -> bool:
    """Set the batch's status and body if its status is one of `expected`, in one statement; False when it was not
    (another control plane or a cancel got there first: read it again)."""
    marks = ", ".join("?" * len(expected))
    return conn.execute(f"UPDATE batches SET status = ?, body = ? WHERE id = ? AND status IN ({marks}) RETURNING id",
                        (status, json.dumps(body, separators=(",", ":")), batch_id, *expected)).fetchone() is not None


def claim(conn: SqlConnection, batch_id: str, holder: str, now: float) -> BatchLine | None:
    """Mark the lowest pending line of the batch "running" for `holder`; that line, or None when none is pending (or
    another holder took it in the same instant: claim again)."""
    row = conn.execute(
        "UPDATE batch_lines SET state = 'running', claimed_by = ?, claimed_at = ? WHERE batch_id = ? AND state = "
        "'pending' AND line = (SELECT min(line) FROM batch_lines WHERE batch_id = ? AND state = 'pending') "
        "RETURNING line, custom_id, request, sent_to", (holder, now, batch_id, batch_id)).fetchone()
    return None if row is None else BatchLine(int(row[0]), row[1], row[2], "running", sent_to=row[3])


def send(conn: SqlConnection, batch_id: str, line: int, holder: str, replica_id: str) -> bool:
    """Record that `holder` sends its claimed line to `replica_id` now; False (send nothing) when the line is no
    longer running for `holder` (handed to another)."""
    return conn.execute("UPDATE batch_lines SET sent_to = ? WHERE batch_id = ? AND line = ? AND state = 'running' "
                        "AND claimed_by = ? RETURNING line", (replica_id, batch_id, line, holder)).fetchone() is not None


def finish(conn: SqlConnection, batch_id: str, line: int, holder: str, ok: bool, result: str) -> bool:
    """Record the result of a line `holder` claimed (state "completed" when `ok`, else "failed"); False when the line
    is not running for `holder` (handed to another: its result is dropped, the other's counts)."""
    return conn.execute(
        "UPDATE batch_lines SET state = ?, result = ? WHERE batch_id = ? AND line = ? AND state = 'running' "
        "AND claimed_by = ? RETURNING line", ("completed" if ok else "failed", result, batch_id, line, holder),
    ).fetchone() is not None


def release(conn: SqlConnection, batch_id: str, line: int, holder: str) -> bool:
    """Hand one line `holder` claimed but did not send back to "pending"; False when it was not running for it."""
    return conn.execute("UPDATE batch_lines SET state = 'pending', claimed_by = NULL, claimed_at = NULL "
                        "WHERE batch_id = ? AND line = ? AND state = 'running' AND claimed_by = ? RETURNING line",
                        (batch_id, line, holder)).fetchone() is not None


def requeue(conn: SqlConnection, batch_id: str, holder: str) -> int:
    """Hand back to "pending" every line of the batch running for a holder other than `holder` (each keeps its
    `sent_to`); returns how many."""
    return len(conn.execute("UPDATE batch_lines SET state = 'pending', claimed_by = NULL, claimed_at = NULL "
                            "WHERE batch_id = ? AND state = 'running' AND claimed_by <> ? RETURNING line",
                            (batch_id, holder)).fetchall())


def results(conn: SqlConnection, batch_id: str) -> list[BatchLine]:
    """The batch's finished lines (completed and failed), in input order."""
    rows = conn.execute("SELECT line, custom_id, request, state, result FROM batch_lines WHERE batch_id = ? AND "
                        "state IN ('completed', 'failed') ORDER BY line", (batch_id,)).fetchall()
    return [BatchLine(int(r[0]), r[1], r[2], r[3], r[4]) for r in rows]


def _delete_ids(conn: SqlConnection, ids: list[str]) -> int:
    for batch_id in ids:
        conn.execute("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,))
    return len(ids)


def purge_expired(conn: SqlConnection, now: float) -> int:
    """Delete every batch kept until `now` or before, with its lines; returns how many batches."""
    return _delete_ids(conn, [row[0] for row in conn.execute(
        "DELETE FROM batches WHERE kept_until <= ? RETURNING id", (now,)).fetchall()])


def purge_project(conn: SqlConnection, project: str) -> int:
    """Delete every batch of `project` with its lines; returns how many batches."""
    return _delete_ids(conn, [row[0] for row in conn.execute(
        "DELETE FROM batches WHERE project = ? RETURNING id", (project,)).fetchall()])

"""The responses the gateway served on `/v1/responses`, kept so a later turn can name one (`previous_response_id`).

One row per stored response (table `responses`, SQLite migration 8, PostgreSQL 6): its id ("resp_" + 32 hex
digits, made by the gateway), the project that owns it, when it was made and until when it is kept (epoch seconds;
`expires_at` = `created_at` + the retention in force when it was written, `store.responses_retention` of
llmgw.yaml), the model name the client used, and `body`: JSON of `{"input": [...], "response": {...}}`, the whole
context the model saw as Responses input items (every earlier turn's input and output, then this turn's input)
and the Response object as the client got it (output items, usage, model, status, ...).

Reads never return a row past its `expires_at`, nor one of another project (both read as "not there"), so the
retention holds even between purges. `purge_expired` deletes rows past their time (the gateway runs it
periodically: `llmgw.gateway.responses_state`); `purge_project` deletes every row of one project (`llmgw purge
--project P`). Functions taking a connection run inside the caller's transaction. The stored text is prompts and
answers: nothing here writes it to a log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llmgw.store.dialects import SqlConnection

DEFAULT_RETENTION_SECONDS = 30 * 86400.0
"""`store.responses_retention` when llmgw.yaml does not set it: 30 days."""


@dataclass(frozen=True)
class StoredResponse:
    """One stored response. `input`: the whole context as Responses input items (earlier turns expanded);
    `response`: the Response object as served (its `output`, `usage`, `model`, ...). Times in epoch seconds."""

    id: str
    project: str
    created_at: float
    expires_at: float
    model: str
    input: list[dict[str, Any]]
    response: dict[str, Any]

    def body(self) -> str:
        """The `body` column: compact JSON of input and response."""
        return json.dumps({"input": self.input, "response": self.response}, separators=(",", ":"))


def insert(conn: SqlConnection, stored: StoredResponse) -> None:
    """Write `stored` (an id written before is replaced: the gateway never reuses one)."""
    conn.execute("INSERT INTO responses (id, project, created_at, expires_at, model, body) VALUES (?, ?, ?, ?, ?, ?) "
                 "ON CONFLICT (id) DO UPDATE SET project = excluded.project, created_at = excluded.created_at, "
                 "expires_at = excluded.expires_at, model = excluded.model, body = excluded.body",
                 (stored.id, stored.project, stored.created_at, stored.expires_at, stored.model, stored.body()))


def find(conn: SqlConnection, response_id: str, project: str, now: float) -> StoredResponse | None:
    """The response `response_id` of `project` while it is kept at `now`; None when there is none, it belongs to
    another project, or it expired."""
    row = conn.execute("SELECT id, project, created_at, expires_at, model, body FROM responses "
                       "WHERE id = ? AND project = ? AND expires_at > ?", (response_id, project, now)).fetchone()
    if row is None:
        return None
    body = json.loads(row[5])
    return StoredResponse(row[0], row[1], float(row[2]), float(row[3]), row[4], body["input"], body["response"])


def delete(conn: SqlConnection, response_id: str, project: str) -> bool:
    """Delete the response `response_id` of `project`; True when a row was deleted (an expired one counts)."""
    return conn.execute("DELETE FROM responses WHERE id = ? AND project = ? RETURNING id",
                        (response_id, project)).fetchone() is not None


def purge_expired(conn: SqlConnection, now: float) -> int:
    """Delete every row whose `expires_at` is at or before `now`; returns how many."""
    return len(conn.execute("DELETE FROM responses WHERE expires_at <= ? RETURNING id", (now,)).fetchall())


def purge_project(conn: SqlConnection, project: str) -> int:
    """Delete every row of `project`, kept or expired; returns how many."""
    return len(conn.execute("DELETE FROM responses WHERE project = ? RETURNING id", (project,)).fetchall())

"""The files of `/v1/files`: batch input a project uploaded and the output files its batches wrote.

Two tables (SQLite migration 10, PostgreSQL 8): `files`, one row per file (its id, "file-" + 24 hex digits made by
the gateway, the project that owns it, its purpose, the client's file name, its size in bytes, when it was made and
until when it is kept, epoch seconds), and `file_chunks`, its bytes in order in chunks of at most CHUNK_BYTES, so
that no row is large and every control plane sharing the store serves the same file.

Reads never return a file past its `expires_at`, nor one of another project (both read as "not there"), so the
retention holds between purges. `purge_expired` deletes files past their time (the gateway runs it periodically),
`purge_project` every file of one project (`llmgw purge --project P`). Functions taking a connection run inside the
caller's transaction. The bytes are prompts and answers: nothing here writes them to a log.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.store.dialects import SqlConnection

CHUNK_BYTES = 1024 * 1024
"""The most bytes one `file_chunks` row holds."""
DEFAULT_RETENTION_SECONDS = 30 * 86400.0
"""`store.files_retention` when llmgw.yaml does not set it: 30 days."""
PURPOSES = ("batch", "batch_output")
"""The purposes a file has here: `batch` (uploaded input of /v1/batches), `batch_output` (a batch's results)."""

_COLUMNS = "id, project, purpose, filename, bytes, created_at, expires_at"


@dataclass(frozen=True)
class FileRecord:
    """One file without its bytes: `bytes` its size; times in epoch seconds."""

    id: str
    project: str
    purpose: str
    filename: str
    bytes: int
    created_at: float
    expires_at: float


def _record(row) -> FileRecord:
    return FileRecord(row[0], row[1], row[2], row[3], int(row[4]), float(row[5]), float(row[6]))


def insert(conn: SqlConnection, record: FileRecord, data: bytes) -> None:
    """Write `record` and its `data` in chunks (an id written before is replaced whole)."""
    conn.execute("DELETE FROM file_chunks WHERE file_id = ?", (record.id,))
    conn.execute("DELETE FROM files WHERE id = ?", (record.id,))
    conn.execute(f"INSERT INTO files ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                 (record.id, record.project, record.purpose, record.filename, record.bytes, record.created_at,
                  record.expires_at))
    for seq, start in enumerate(range(0, len(data), CHUNK_BYTES)):
        conn.execute("INSERT INTO file_chunks (file_id, seq, data) VALUES (?, ?, ?)",
                     (record.id, seq, data[start:start + CHUNK_BYTES]))


def find(conn: SqlConnection, file_id: str, project: str | None, now: float) -> FileRecord | None:
    """The file `file_id` of `project` (None: of any project) while kept at `now`; None otherwise."""
    sql, params = f"SELECT {_COLUMNS} FROM files WHERE id = ? AND expires_at > ?", [file_id, now]
    if project is not None:
        sql, params = sql + " AND project = ?", [*params, project]
    row = conn.execute(sql, params).fetchone()
    return None if row is None else _record(row)


def listed(conn: SqlConnection, project: str, purpose: str | None, after: str | None, limit: int, newest_first: bool,
           now: float) -> list[FileRecord]:
    """Up to `limit` kept files of `project` (of `purpose` when given), by creation time (newest first or oldest
    first), starting after the file `after` (its creation time and id; an unknown `after` starts at the beginning)."""
    where, params = ["project = ?", "expires_at > ?"], [project, now]
    if purpose is not None:
        where.append("purpose = ?")
        params.append(purpose)
    if after is not None:
        mark = conn.execute("SELECT created_at, id FROM files WHERE id = ? AND project = ?", (after, project)).fetchone()
        if mark is not None:
            where.append("(created_at, id) < (?, ?)" if newest_first else "(created_at, id) > (?, ?)")
            params.extend([mark[0], mark[1]])
    order = "DESC" if newest_first else "ASC"
    rows = conn.execute(f"SELECT {_COLUMNS} FROM files WHERE {' AND '.join(where)} "
                        f"ORDER BY created_at {order}, id {order} LIMIT ?", (*params, limit)).fetchall()
    return [_record(row) for row in rows]


def content(conn: SqlConnection, file_id: str) -> bytes:
    """The bytes of `file_id`, its chunks joined in order (b"" when it has none)."""
    rows = conn.execute("SELECT data FROM file_chunks WHERE file_id = ? ORDER BY seq", (file_id,)).fetchall()
    return b"".join(bytes(row[0]) for row in rows)


def delete(conn: SqlConnection, file_id: str, project: str) -> bool:
    """Delete the file `file_id` of `project` and its chunks; True when it was there (an expired one counts)."""
    gone = conn.execute("DELETE FROM files WHERE id = ? AND project = ? RETURNING id", (file_id, project)).fetchone()
    if gone is None:
        return False
    conn.execute("DELETE FROM file_chunks WHERE file_id = ?", (file_id,))
    return True


def _delete_ids(conn: SqlConnection, ids: list[str]) -> int:
    for file_id in ids:
        conn.execute("DELETE FROM file_chunks WHERE file_id = ?", (file_id,))
    return len(ids)


def purge_expired(conn: SqlConnection, now: float) -> int:
    """Delete every file whose `expires_at` is at or before `now`, with its chunks; returns how many files."""
    ids = [row[0] for row in conn.execute("DELETE FROM files WHERE expires_at <= ? RETURNING id", (now,)).fetchall()]
    return _delete_ids(conn, ids)


def purge_project(conn: SqlConnection, project: str) -> int:
    """Delete every file of `project`, kept or expired, with its chunks; returns how many files."""
    ids = [row[0] for row in conn.execute("DELETE FROM files WHERE project = ? RETURNING id", (project,)).fetchall()]
    return _delete_ids(conn, ids)

"""The SQLite schema as numbered migrations (PostgreSQL has its own: `postgres_schema`), applied in order and recorded in `schema_migrations`.

A migration is never edited once released: a change is a new migration at the end of `MIGRATIONS`, one that only
expands (`llmgw.store.compat`: the previous release keeps using the store while the fleet upgrades); a drop or rename
comes a release later, listed in `compat.SQLITE_CONTRACTS`. A store file whose version is newer than this code
knows is used as it is when its record (`compat.READABLE_TABLE`) says this code may, and refused otherwise.
"""

from __future__ import annotations

import sqlite3
import time

from llmgw.errors import StoreError
from llmgw.store.compat import READABLE_TABLE, SQLITE_CONTRACTS, newer_store_refusal, readable_from

MIGRATIONS: tuple[str, ...] = (
    # 1: secrets, key/value, admin tokens, API keys, quotas, usage, leases
    """
    CREATE TABLE secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL, created_at REAL NOT NULL);
    CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL, updated_at REAL NOT NULL);
    CREATE TABLE admin_tokens (hash BLOB PRIMARY KEY, created_at REAL NOT NULL);
    CREATE TABLE api_keys (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, name TEXT, prefix TEXT NOT NULL,
        created_at REAL NOT NULL, expires_at REAL, revoked_at REAL, hash BLOB NOT NULL UNIQUE
    );
    CREATE INDEX api_keys_project ON api_keys (project);
    CREATE TABLE quota_windows (
        scope TEXT NOT NULL, period TEXT NOT NULL, start REAL NOT NULL,
        requests INTEGER NOT NULL, tokens INTEGER NOT NULL, cost REAL NOT NULL,
        PRIMARY KEY (scope, period, start)
    ) WITHOUT ROWID;
    CREATE TABLE quota_slots (reservation_id TEXT NOT NULL, scope TEXT NOT NULL, expires_at REAL NOT NULL);
    CREATE INDEX quota_slots_scope ON quota_slots (scope, expires_at);
    CREATE INDEX quota_slots_reservation ON quota_slots (reservation_id);
    CREATE TABLE quota_reservations (
        id TEXT PRIMARY KEY, created_at REAL NOT NULL, state TEXT NOT NULL,
        estimated_tokens INTEGER NOT NULL, estimated_cost REAL NOT NULL, charges TEXT NOT NULL
    );
    CREATE INDEX quota_reservations_created ON quota_reservations (created_at);
    CREATE TABLE usage (
        id INTEGER PRIMARY KEY, time REAL NOT NULL, project TEXT NOT NULL, key_id TEXT, model TEXT NOT NULL,
        replica TEXT, node TEXT, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
        cached_tokens INTEGER NOT NULL, ttft_seconds REAL, duration_seconds REAL NOT NULL,
        status INTEGER NOT NULL, cost REAL NOT NULL
    );
    CREATE INDEX usage_time ON usage (time);
    CREATE INDEX usage_project_time ON usage (project, time);
    CREATE TABLE leases (name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL);
    """,
    # 2: reservations are deleted when closed, so the table holds only open ones: keyed by id WITHOUT ROWID and
    # without the created_at index (one b-tree instead of three: reserve and settle each write one page, not three)
    """
    CREATE TABLE quota_reservations_open (
        id TEXT PRIMARY KEY, created_at REAL NOT NULL, state TEXT NOT NULL,
        estimated_tokens INTEGER NOT NULL, estimated_cost REAL NOT NULL, charges TEXT NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO quota_reservations_open SELECT * FROM quota_reservations WHERE state = 'open';
    DROP TABLE quota_reservations;
    ALTER TABLE quota_reservations_open RENAME TO quota_reservations;
    """,
    # 3: a usage row carries the idempotency id of the spool entry that wrote it: written at most once
    """
    ALTER TABLE usage ADD COLUMN request_id TEXT;
    CREATE UNIQUE INDEX usage_request ON usage (request_id);
    """,
    # 4: a lease carries a fencing token, raised each time another holder (or the same one after expiry) takes it
    """
    ALTER TABLE leases ADD COLUMN token INTEGER NOT NULL DEFAULT 1;
    """,
    # 5: one kind of token with a scope each (admin, metrics, review, console); the admin tokens become tokens of
    # scope admin (id from their digest, prefix unknown: only the digest was kept)
    """
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY, scope TEXT NOT NULL, name TEXT, prefix TEXT NOT NULL,
        created_at REAL NOT NULL, expires_at REAL, revoked_at REAL, hash BLOB NOT NULL UNIQUE
    );
    INSERT INTO tokens (id, scope, name, prefix, created_at, expires_at, revoked_at, hash)
        SELECT 'tok_' || lower(hex(substr(hash, 1, 6))), 'admin', NULL, 'llmgw-admin-', created_at, NULL, NULL, hash
        FROM admin_tokens;
    DROP TABLE admin_tokens;
    """,
    # 6: a usage row keeps the client's own x-request-id (not unique: found by it too), the settings commit its
    # replica was started from, and the request's trace id
    """
    ALTER TABLE usage ADD COLUMN client_request_id TEXT;
    ALTER TABLE usage ADD COLUMN settings_commit TEXT;
    ALTER TABLE usage ADD COLUMN trace_id TEXT;
    CREATE INDEX usage_client_request ON usage (client_request_id);
    """,
    # 7: the Linux users llmgw makes on Slurm nodes from project members (slurm.yaml `users: llmgw`): one row per
    # e-mail ever given a login and a UID; rows are never deleted, so a UID is never given to anyone else
    """
    CREATE TABLE slurm_users (
        email TEXT PRIMARY KEY, login TEXT NOT NULL UNIQUE, uid INTEGER NOT NULL UNIQUE, created_at REAL NOT NULL
    );
    """,
    # 8: the responses the gateway served on /v1/responses (`llmgw.store.responses`): the whole context and the
    # answer as JSON, kept until `expires_at` (the retention in force when it was written), found by id and project
    """
    CREATE TABLE responses (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL,
        model TEXT NOT NULL, body TEXT NOT NULL
    );
    CREATE INDEX responses_expires ON responses (expires_at);
    CREATE INDEX responses_project ON responses (project);
    """,
    # 9: results of `llmgw bench` (`llmgw.store.benches`): one row per run against one replica
    """
    CREATE TABLE bench_results (
        id INTEGER PRIMARY KEY, time REAL NOT NULL, replica TEXT NOT NULL, model TEXT NOT NULL, node TEXT NOT NULL,
        node_class TEXT NOT NULL, engine_build TEXT NOT NULL, via TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL, concurrency INTEGER NOT NULL, requests INTEGER NOT NULL,
        ttft_p50_seconds REAL, ttft_p90_seconds REAL, itl_p50_seconds REAL, output_tokens_per_second REAL NOT NULL,
        summary TEXT NOT NULL
    );
    CREATE INDEX bench_results_replica_time ON bench_results (replica, time);
    """,
    # 10: files of /v1/files in chunks, batches of /v1/batches with one row per input line (`llmgw.store.files`,
    # `llmgw.store.batches`), and the batch a usage row came from
    """
    CREATE TABLE files (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
        bytes INTEGER NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL
    );
    CREATE INDEX files_project ON files (project, created_at);
    CREATE INDEX files_expires ON files (expires_at);
    CREATE TABLE file_chunks (
        file_id TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (file_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE batches (
        id TEXT PRIMARY KEY, project TEXT NOT NULL, key_id TEXT, status TEXT NOT NULL, created_at REAL NOT NULL,
        kept_until REAL NOT NULL, body TEXT NOT NULL
    );
    CREATE INDEX batches_project ON batches (project, created_at);
    CREATE INDEX batches_status ON batches (status);
    CREATE INDEX batches_kept ON batches (kept_until);
    CREATE TABLE batch_lines (
        batch_id TEXT NOT NULL, line INTEGER NOT NULL, state TEXT NOT NULL, custom_id TEXT, request TEXT NOT NULL,
        result TEXT, claimed_by TEXT, claimed_at REAL, PRIMARY KEY (batch_id, line)
    ) WITHOUT ROWID;
    CREATE INDEX batch_lines_state ON batch_lines (batch_id, state, line);
    ALTER TABLE usage ADD COLUMN batch_id TEXT;
    """,
    # 11: people (`llmgw.store.accounts`): local accounts by e-mail with a scrypt hash of their password, and the
    # person a token of the admin listener belongs to (`owner`, an account's e-mail; NULL: nobody's, as before)
    """
    CREATE TABLE accounts (
        email TEXT PRIMARY KEY, name TEXT NOT NULL, password TEXT NOT NULL, created_at REAL NOT NULL,
        password_changed_at REAL NOT NULL, disabled_at REAL
    );
    ALTER TABLE tokens ADD COLUMN owner TEXT;
    """,
    # 12: the replica a batch line was sent to (`llmgw.store.batches`: a line handed back runs there again, where the
    # engine relay holds its answer)
    """
    ALTER TABLE batch_lines ADD COLUMN sent_to TEXT;
    """,
    # 13: who made and who revoked an API key through the admin API (a person's e-mail; NULL: nobody's token, the
    # CLI, or a key made before)
    """
    ALTER TABLE api_keys ADD COLUMN created_by TEXT;
    ALTER TABLE api_keys ADD COLUMN revoked_by TEXT;
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(conn: sqlite3.Connection) -> int:
    """The highest migration applied to the open database (0 for a new, empty file)."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if not exists:
        return 0
    return conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()[0]


def migrate(conn: sqlite3.Connection, where: str) -> int:
    """Apply the missing migrations in one `BEGIN IMMEDIATE` transaction and record the oldest schema that may use
    the file (`compat.READABLE_TABLE`); returns the file's schema version.

    `conn` must be in autocommit mode (isolation_level None). Safe when several processes open the same
    file at once: the write lock makes the second see the first's work. A file of a newer schema is left as it is
    when its record says this llmgw may use it (returns its version); else raises StoreError naming both versions.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
        current = schema_version(conn)
        if current > SCHEMA_VERSION:
            refusal = newer_store_refusal(where, current, _readable(conn), SCHEMA_VERSION, "SQLite")
            if refusal is not None:
                raise StoreError(refusal)
            conn.execute("COMMIT")
            return current
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version - 1].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)", (version, time.time()))
        wanted = readable_from(SCHEMA_VERSION, SQLITE_CONTRACTS)
        if _readable(conn) != wanted:  # written once per schema: an open of an up-to-date file writes nothing
            conn.execute(f"CREATE TABLE IF NOT EXISTS {READABLE_TABLE} (readable_from INTEGER NOT NULL)")
            conn.execute(f"DELETE FROM {READABLE_TABLE}")
            conn.execute(f"INSERT INTO {READABLE_TABLE} VALUES (?)", (wanted,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return SCHEMA_VERSION


def _readable(conn: sqlite3.Connection) -> int | None:
    """The file's record of the oldest schema that may use it (None: none, a file migrated before the record)."""
    try:
        row = conn.execute(f"SELECT max(readable_from) FROM {READABLE_TABLE}").fetchone()
    except sqlite3.OperationalError:
        return None
    return int(row[0]) if row and row[0] is not None else None

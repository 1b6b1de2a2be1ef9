"""`SqlStore`: the `Store` methods written once over a `SqlConnection`, for both backends.

A backend (`SqliteStore`, `PostgresStore`) supplies three things: `_write()`, a context manager giving a
connection inside one write transaction (committed when the block ends, rolled back on an exception) with its
errors mapped to `TemporaryError` / `StoreError`; `_read()`, the same for a plain read; and `close()`. The
statements come from `keys`, `quotas` and `usage`; the quota rules are pure functions of `quotas`.
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager

from llmgw.errors import UsageError
from llmgw.identity import Quota
from llmgw.store import accounts, benches, keys, quotas, slurm_users
from llmgw.store import batches as batches_table
from llmgw.store import files as files_table
from llmgw.store import responses as responses_table
from llmgw.store import usage as usage_table
from llmgw.store.dialects import SqlConnection
from llmgw.store.batches import BatchLine, BatchRecord
from llmgw.store.benches import BenchRecord
from llmgw.store.files import FileRecord
from llmgw.store.responses import StoredResponse
from llmgw.store.records import (
    SCOPE_ADMIN,
    Account,
    ApiKey,
    Headroom,
    KeyCheck,
    Lease,
    LimitUse,
    Rejection,
    Reservation,
    Settlement,
    SlurmUser,
    Token,
    UsageLoad,
    UsageRecord,
    UsageRow,
)

PRUNE_INTERVAL = 30.0

# Every table a store holds, parents first (what `llmgw store copy` moves, in this order), with its columns.
TABLES: dict[str, tuple[str, ...]] = {
    "secrets": ("name", "value", "created_at"),
    "kv": ("key", "value", "updated_at"),
    "accounts": ("email", "name", "password", "created_at", "password_changed_at", "disabled_at"),
    "tokens": ("id", "scope", "name", "prefix", "created_at", "expires_at", "revoked_at", "hash", "owner"),
    "api_keys": ("id", "project", "name", "prefix", "created_at", "expires_at", "revoked_at", "hash", "created_by",
                 "revoked_by"),
    "quota_windows": ("scope", "period", "start", "requests", "tokens", "cost"),
    "quota_slots": ("reservation_id", "scope", "expires_at"),
    "quota_reservations": ("id", "created_at", "state", "estimated_tokens", "estimated_cost", "charges"),
    "usage": ("id", "time", "project", "key_id", "model", "replica", "node", "prompt_tokens", "completion_tokens",
              "cached_tokens", "ttft_seconds", "duration_seconds", "status", "cost", "request_id", "client_request_id",
              "settings_commit", "trace_id", "batch_id"),
    "leases": ("name", "holder", "expires_at", "token"),
    "slurm_users": ("email", "login", "uid", "created_at"),
    "responses": ("id", "project", "created_at", "expires_at", "model", "body"),
    "bench_results": benches.COLUMNS,
    "files": ("id", "project", "purpose", "filename", "bytes", "created_at", "expires_at"),
    "file_chunks": ("file_id", "seq", "data"),
    "batches": ("id", "project", "key_id", "status", "created_at", "kept_until", "body"),
    "batch_lines": ("batch_id", "line", "state", "custom_id", "request", "result", "claimed_by", "claimed_at"),
}
# The order rows are read in (for copies and comparisons that must not depend on physical order).
TABLE_ORDER: dict[str, str] = {
    "secrets": "name", "kv": "key", "accounts": "email", "tokens": "id", "api_keys": "id",
    "quota_windows": "scope, period, start", "quota_slots": "reservation_id, scope", "quota_reservations": "id",
    "usage": "id", "leases": "name", "slurm_users": "uid", "responses": "id",
    "bench_results": "id", "files": "id", "file_chunks": "file_id, seq", "batches": "id",
    "batch_lines": "batch_id, line",
}


def _now(now: float | None) -> float:
    return time.time() if now is None else now


class SqlStore:
    """The backend-independent half of a `Store` (see the module docstring)."""

    url: str
    slot_ttl: float
    _last_prune: float = 0.0

    def _write(self) -> AbstractContextManager[SqlConnection]:
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[SqlConnection]:
        raise NotImplementedError

    # -- secrets and key/value ---------------------------------------------------------------------------------
    def get_or_create_secret(self, name: str, nbytes: int = 32) -> bytes:
        with self._read() as conn:
            row = conn.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone()
        if row is not None:
            return bytes(row[0])
        with self._write() as conn:
            conn.execute("INSERT INTO secrets (name, value, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                         (name, secrets.token_bytes(nbytes), time.time()))
            return bytes(conn.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone()[0])

    def get(self, key: str) -> str | None:
        with self._read() as conn:
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, value: str) -> None:
        with self._write() as conn:
            conn.execute("INSERT INTO kv (key, value, updated_at) VALUES (?, ?, ?) "
                         "ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                         (key, value, time.time()))

    def swap(self, key: str, expected: str | None, value: str) -> bool:
        with self._write() as conn:
            if expected is None:
                row = conn.execute("INSERT INTO kv (key, value, updated_at) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING "
                                   "RETURNING key", (key, value, time.time())).fetchone()
            else:
                row = conn.execute("UPDATE kv SET value = ?, updated_at = ? WHERE key = ? AND value = ? RETURNING key",
                                   (value, time.time(), key, expected)).fetchone()
        return row is not None

    # -- tokens of the admin listener ----------------------------------------------------------------------------
    def create_token(self, scope: str, name: str | None = None, expires_at: float | None = None,
                     now: float | None = None, owner: str | None = None) -> tuple[Token, str]:
        with self._write() as conn:
            return keys.insert_token(conn, scope, name, expires_at, _now(now),
                                     None if owner is None else accounts.normal_email(owner))

    def check_token(self, token: str, scope: str, now: float | None = None) -> bool:
        with self._read() as conn:
            return keys.check_token(conn, token, scope, _now(now))

    def find_token(self, token: str) -> Token | None:
        with self._read() as conn:
            return keys.find_token(conn, token)

    def token_by_id(self, token_id: str) -> Token | None:
        with self._read() as conn:
            return keys.token_by_id(conn, token_id)

    def list_tokens(self, scope: str | None = None) -> list[Token]:
        with self._read() as conn:
            return keys.list_tokens(conn, scope)

    def revoke_token(self, token_id: str, now: float | None = None) -> Token:
        with self._write() as conn:
            return keys.revoke_token(conn, token_id, _now(now))

    def create_admin_token(self) -> str:
        return self.create_token(SCOPE_ADMIN)[1]

    def check_admin_token(self, token: str) -> bool:
        return self.check_token(token, SCOPE_ADMIN)

    # -- API keys ----------------------------------------------------------------------------------------------
    def create_api_key(self, project: str, name: str | None = None, expires_at: float | None = None,
                       now: float | None = None, created_by: str | None = None) -> tuple[ApiKey, str]:
        with self._write() as conn:
            return keys.insert_api_key(conn, project, name, expires_at, _now(now), created_by)

    def check_api_key(self, plaintext: str, now: float | None = None) -> KeyCheck:
        with self._read() as conn:
            return keys.check_api_key(conn, plaintext, _now(now))

    def authenticate(self, plaintext: str, now: float | None = None) -> ApiKey | None:
        return self.check_api_key(plaintext, now).key

    def list_api_keys(self, project: str | None = None) -> list[ApiKey]:
        with self._read() as conn:
            return keys.list_api_keys(conn, project)

    def revoke_api_key(self, key_id: str, now: float | None = None, by: str | None = None) -> ApiKey:
        with self._write() as conn:
            return keys.revoke_api_key(conn, key_id, _now(now), by)

    # -- quotas ------------------------------------------------------------------------------------------------
    def reserve(self, scopes: Sequence[tuple[str, Quota]], estimated_tokens: int, estimated_cost: float,
                now: float | None = None) -> Reservation | Rejection:
        outcome = self.reserve_many([(scopes, estimated_tokens, estimated_cost, now)])[0]
        if isinstance(outcome, UsageError):
            raise outcome
        return outcome

    def reserve_many(self, requests: Sequence[tuple[Sequence[tuple[str, Quota]], int, float, float | None]]
                     ) -> list[Reservation | Rejection | UsageError]:
        """`reserve` of each (scopes, estimated_tokens, estimated_cost, now) of `requests`, in order, in one
        transaction (a group commit): each decided on what the ones before it in the group left, exactly as one by
        one. Every limited scope of the group is locked first, in one sorted statement (PostgreSQL), so two groups
        never deadlock on scopes; then every request's usage is read at once and brought up to date in memory with
        the reservations before it (`quotas.with_reservation`): on PostgreSQL a group takes two round trips, as one
        reservation does (`dialects.PostgresBatch`).

        One outcome per request: a Reservation, a Rejection, or a UsageError (not raised) for negative estimates.
        Raises TemporaryError or StoreError for the whole group (nothing is written).
        """
        outcomes: list = [None] * len(requests)
        limited: list[tuple[int, Sequence[tuple[str, Quota]], int, float, float]] = []
        for index, (scopes, estimated_tokens, estimated_cost, now) in enumerate(requests):
            now = _now(now)
            if estimated_tokens < 0 or estimated_cost < 0:
                outcomes[index] = UsageError("A reservation's estimated tokens and cost cannot be negative.")
            elif not any(quotas.has_limits(limits) for _scope, limits in scopes):
                outcomes[index] = Reservation(None, (), estimated_tokens, estimated_cost, now)
            else:
                limited.append((index, scopes, estimated_tokens, estimated_cost, now))
        if not limited:
            return outcomes
        with self._write() as conn:
            latest = max(now for *_rest, now in limited)
            if latest - self._last_prune >= PRUNE_INTERVAL:
                quotas.prune(conn, latest)
                self._last_prune = latest
            conn.lock_scopes([scope for _index, scopes, *_rest in limited
                              for scope, limits in scopes if quotas.has_limits(limits)])
            # every snapshot read at once (one round trip with the lock on PostgreSQL), each then brought up to
            # date with the reservations taken before it in the group
            reads = [quotas.queue_snapshot(conn, [(s, q) for s, q in scopes if quotas.has_limits(q)], now)
                     for _index, scopes, _tokens, _cost, now in limited]
            snapshots = [read() for read in reads]  # all read before any write (a SQLite cursor reads lazily)
            taken: list[Reservation] = []
            for (index, scopes, estimated_tokens, estimated_cost, now), snapshot in zip(limited, snapshots,
                                                                                        strict=True):
                for reservation in taken:
                    snapshot = quotas.with_reservation(snapshot, reservation)
                outcome = quotas.reserve(conn, scopes, estimated_tokens, estimated_cost, now,
                                         "res_" + uuid.uuid4().hex, self.slot_ttl, locked=True, snapshot=snapshot)
                if isinstance(outcome, Reservation):
                    taken.append(outcome)
                outcomes[index] = outcome
        return outcomes

    def settle(self, reservation: Reservation, actual_tokens: int, actual_cost: float, now: float | None = None,
               usage: UsageRecord | None = None) -> bool:
        now = _now(now)
        if reservation.reservation_id is None and usage is None:
            return True
        with self._write() as conn:
            settled = True
            if reservation.reservation_id is not None:
                settled = quotas.close(conn, reservation.reservation_id, (int(actual_tokens), float(actual_cost)), now,
                                       bool(reservation.slots))
            if usage is not None:
                usage_table.insert_usage(conn, usage)
            return settled

    def release(self, reservation: Reservation, now: float | None = None) -> bool:
        if reservation.reservation_id is None:
            return True
        with self._write() as conn:
            return quotas.close(conn, reservation.reservation_id, None, _now(now), bool(reservation.slots))

    def renew(self, reservation: Reservation, now: float | None = None) -> bool:
        if reservation.reservation_id is None or not reservation.slots:
            return False
        with self._write() as conn:
            return quotas.renew(conn, reservation.reservation_id, _now(now), self.slot_ttl) > 0

    def headroom(self, scopes: Sequence[tuple[str, Quota]], now: float | None = None) -> Headroom:
        if not any(quotas.has_limits(limits) for _scope, limits in scopes):
            return Headroom()
        with self._read() as conn:
            return quotas.read_headroom(conn, scopes, _now(now))

    def quota_use(self, scopes: Sequence[tuple[str, Quota]], now: float | None = None) -> list[LimitUse]:
        with self._read() as conn:
            return quotas.read_use(conn, scopes, _now(now))

    def apply_settlement(self, settlement: Settlement) -> bool:
        """Close the settlement's reservation and record its usage in one transaction, at most once per entry id.

        Returns False when a settlement with this `entry_id` was applied before (nothing is written again).
        """
        return self.apply_settlements([settlement])[0]

    def apply_settlements(self, settlements: Sequence[Settlement]) -> list[bool]:
        """`apply_settlement` of each of `settlements` (in order), all in one transaction: a group commit, one
        round trip on PostgreSQL (`quotas.close_charged`, `usage.insert_usage_many`) however many there are.

        Each settlement is written whole or not at all, and so is the group: an error writes none of them. Returns
        one bool per settlement, False for one whose `entry_id` was applied before, or comes again in the group,
        whose usage is then not written again; a reservation closed twice in the group is closed once, by the first.
        """
        results = [True] * len(settlements)
        work: list[tuple[int, Settlement]] = []
        entries: set[str] = set()
        for index, settlement in enumerate(settlements):
            if settlement.entry_id in entries:
                results[index] = False
            elif settlement.usage is not None or settlement.reservation_id is not None:
                entries.add(settlement.entry_id)
                work.append((index, settlement))
        if not work:
            return results
        written: set[str] = set()
        with self._write() as conn:
            # Applied before: the usage insert writes nothing, and the reservation is gone already (closed in that
            # same first transaction), so closing it again changes nothing either.
            records = [(s.usage, s.entry_id) for _index, s in work if s.usage is not None]
            inserted = usage_table.insert_usage_many(conn, records) if records else None
            charged_closes, closing = [], set()
            for _index, settlement in work:
                reservation_id = settlement.reservation_id
                if reservation_id is None or reservation_id in closing:
                    continue
                closing.add(reservation_id)
                actual = None if settlement.actual_tokens is None else (int(settlement.actual_tokens),
                                                                        float(settlement.actual_cost))
                if settlement.charges is not None and conn.dialect == "postgresql":
                    charged_closes.append((reservation_id, settlement.charges, actual, settlement.time,
                                           settlement.has_slots))
                else:
                    quotas.close(conn, reservation_id, actual, settlement.time, settlement.has_slots)
            quotas.close_charged(conn, charged_closes)
            if inserted is not None and not conn.batched:
                written = {row[0] for row in inserted.fetchall()}
        if inserted is not None and conn.batched:  # a batch's rows are there after its COMMIT
            written = {row[0] for row in inserted.fetchall()}
        for index, settlement in work:
            if settlement.usage is not None:
                results[index] = settlement.entry_id in written
        return results

    # -- usage -------------------------------------------------------------------------------------------------
    def record_usage(self, record: UsageRecord) -> None:
        with self._write() as conn:
            usage_table.insert_usage(conn, record)

    def record_usage_once(self, record: UsageRecord, request_id: str) -> bool:
        with self._write() as conn:
            return usage_table.insert_usage(conn, record, request_id).fetchone() is not None

    def query_usage(self, project: str | Sequence[str] | None = None, since: float | None = None,
                    by: str = "model", model: str | None = None) -> list[UsageRow]:
        with self._read() as conn:
            return usage_table.query_usage(conn, project, since, by, model)

    def usage_load(self, since: float, ttft_limit: int = 10000) -> UsageLoad:
        with self._read() as conn:
            return usage_table.usage_load(conn, since, ttft_limit)

    def usage_of_replica(self, model: str, replica: str, settings_commit: str, since: float,
                         limit: int = 100000) -> list[UsageRecord]:
        with self._read() as conn:
            return usage_table.usage_of_replica(conn, model, replica, settings_commit, since, limit)

    def ttfts_of_model(self, model: str, since: float, limit: int = 10000) -> list[float]:
        with self._read() as conn:
            return usage_table.ttfts_of_model(conn, model, since, limit)

    def usage_of_request(self, request_id: str) -> UsageRecord | None:
        with self._read() as conn:
            return usage_table.usage_of_request(conn, request_id)

    def usage_of_client_request(self, client_request_id: str, limit: int = 10) -> list[tuple[str, UsageRecord]]:
        with self._read() as conn:
            return usage_table.usage_of_client_request(conn, client_request_id, limit)

    def recent_usage(self, project: str | None = None, since: float | None = None,
                     limit: int = 100) -> list[UsageRecord]:
        with self._read() as conn:
            return usage_table.list_usage(conn, project, since, limit)

    # -- leases ------------------------------------------------------------------------------------------------
    def acquire_lease(self, name: str, holder: str, ttl_seconds: float, now: float | None = None) -> int:
        with self._write() as conn:
            # `now` None: the database's clock, the one all control planes sharing the store read (each one's own
            # clock let a skew of D seconds make D seconds of two leaders)
            clock, at = (conn.now_expression, ()) if now is None else ("?", (now,))
            # one statement: taken when free, expired or already ours; untouched (0 rows) while another holds it.
            # The token stays while the same holder holds or takes it again and rises by one when another takes it.
            row = conn.execute(
                f"INSERT INTO leases (name, holder, expires_at, token) VALUES (?, ?, {clock} + ?, 1) ON CONFLICT "
                "(name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at, "
                "token = CASE WHEN leases.holder = excluded.holder THEN leases.token ELSE leases.token + 1 END "
                f"WHERE leases.holder = excluded.holder OR leases.expires_at <= {clock} RETURNING token",
                (name, holder, *at, ttl_seconds, *at),
            ).fetchone()
        return 0 if row is None else int(row[0])

    def release_lease(self, name: str, holder: str) -> bool:
        with self._write() as conn:
            # the row stays (expired at once) so another holder's next token is still higher than this one's
            return conn.execute("UPDATE leases SET expires_at = 0 WHERE name = ? AND holder = ? AND expires_at > 0 "
                                "RETURNING name", (name, holder)).fetchone() is not None

    def lease_holder(self, name: str, now: float | None = None) -> str | None:
        lease = self.lease(name, now)
        return None if lease is None else lease.holder

    def lease(self, name: str, now: float | None = None) -> Lease | None:
        with self._read() as conn:
            clock, at = (conn.now_expression, ()) if now is None else ("?", (now,))
            row = conn.execute(f"SELECT holder, token, expires_at FROM leases WHERE name = ? AND expires_at > {clock}",
                               (name, *at)).fetchone()
        return None if row is None else Lease(row[0], int(row[1]), float(row[2]))

    # -- people's accounts (llmgw.store.accounts) -----------------------------------------------------------------
    def add_account(self, email: str, name: str, password: str, now: float | None = None) -> Account:
        accounts.normal_email(email)
        hashed = accounts.hash_password(password)  # the CPU work outside the write transaction
        with self._write() as conn:
            return accounts.insert_account(conn, email, name, hashed, _now(now))

    def account(self, email: str) -> Account | None:
        with self._read() as conn:
            return accounts.find_account(conn, email)

    def list_accounts(self) -> list[Account]:
        with self._read() as conn:
            return accounts.list_accounts(conn)

    def check_password(self, email: str, password: str) -> Account | None:
        with self._read() as conn:
            row = accounts.password_row(conn, email)
        return accounts.matching(row, password)  # the CPU work after the read transaction

    def set_password(self, email: str, password: str, now: float | None = None) -> Account:
        hashed = accounts.hash_password(password)
        with self._write() as conn:
            return accounts.set_password(conn, email, hashed, _now(now))

    def set_account_disabled(self, email: str, disabled: bool, now: float | None = None) -> Account:
        with self._write() as conn:
            return accounts.set_disabled(conn, email, disabled, _now(now))

    # -- Linux users on Slurm nodes -------------------------------------------------------------------------------
    def slurm_users(self) -> list[SlurmUser]:
        with self._read() as conn:
            return slurm_users.list_users(conn)

    def assign_slurm_users(self, wanted: Sequence[tuple[str, Sequence[str]]], first_uid: int,
                           now: float | None = None) -> list[SlurmUser]:
        with self._write() as conn:
            return slurm_users.assign_users(conn, wanted, first_uid, _now(now))

    # -- responses of /v1/responses (llmgw.store.responses) --------------------------------------------------------
    def save_response(self, stored: StoredResponse) -> None:
        with self._write() as conn:
            responses_table.insert(conn, stored)

    def load_response(self, response_id: str, project: str, now: float | None = None) -> StoredResponse | None:
        with self._read() as conn:
            return responses_table.find(conn, response_id, project, _now(now))

    def delete_response(self, response_id: str, project: str) -> bool:
        with self._write() as conn:
            return responses_table.delete(conn, response_id, project)

    def purge_responses(self, project: str | None = None, now: float | None = None) -> int:
        with self._write() as conn:
            if project is not None:
                return responses_table.purge_project(conn, project)
            return responses_table.purge_expired(conn, _now(now))

    # -- files of /v1/files (llmgw.store.files) ------------------------------------------------------------------
    def save_file(self, record: FileRecord, data: bytes) -> None:
        with self._write() as conn:
            files_table.insert(conn, record, data)

    def file_record(self, file_id: str, project: str | None, now: float | None = None) -> FileRecord | None:
        with self._read() as conn:
            return files_table.find(conn, file_id, project, _now(now))

    def list_files(self, project: str, purpose: str | None = None, after: str | None = None, limit: int = 10000,
                   newest_first: bool = True, now: float | None = None) -> list[FileRecord]:
        with self._read() as conn:
            return files_table.listed(conn, project, purpose, after, limit, newest_first, _now(now))

    def file_content(self, file_id: str, project: str | None, now: float | None = None) -> bytes | None:
        with self._read() as conn:
            if files_table.find(conn, file_id, project, _now(now)) is None:
                return None
            return files_table.content(conn, file_id)

    def delete_file(self, file_id: str, project: str) -> bool:
        with self._write() as conn:
            return files_table.delete(conn, file_id, project)

    def purge_files(self, project: str | None = None, now: float | None = None) -> int:
        with self._write() as conn:
            if project is not None:
                return files_table.purge_project(conn, project)
            return files_table.purge_expired(conn, _now(now))

    # -- batches of /v1/batches (llmgw.store.batches) ------------------------------------------------------------
    def create_batch(self, record: BatchRecord, lines: Sequence[BatchLine]) -> None:
        with self._write() as conn:
            batches_table.insert(conn, record, lines)

    def batch(self, batch_id: str, project: str | None = None, now: float | None = None) -> BatchRecord | None:
        with self._read() as conn:
            return batches_table.find(conn, batch_id, project, _now(now))

    def list_batches(self, project: str, after: str | None = None, limit: int = 20,
                     now: float | None = None) -> list[BatchRecord]:
        with self._read() as conn:
            return batches_table.listed(conn, project, after, limit, _now(now))

    def active_batches(self) -> list[BatchRecord]:
        with self._read() as conn:
            return batches_table.active(conn)

    def update_batch(self, batch_id: str, expected: Sequence[str], status: str, body: dict,
                     outputs: Sequence[tuple[FileRecord, bytes]] = ()) -> bool:
        with self._write() as conn:
            if not batches_table.update(conn, batch_id, expected, status, body):
                return False
            for record, data in outputs:
                files_table.insert(conn, record, data)
            return True

    def claim_batch_line(self, batch_id: str, holder: str, now: float | None = None) -> BatchLine | None:
        with self._write() as conn:
            return batches_table.claim(conn, batch_id, holder, _now(now))

    def send_batch_line(self, batch_id: str, line: int, holder: str, replica_id: str) -> bool:
        with self._write() as conn:
            return batches_table.send(conn, batch_id, line, holder, replica_id)

    def finish_batch_line(self, batch_id: str, line: int, holder: str, ok: bool, result: str) -> bool:
        with self._write() as conn:
            return batches_table.finish(conn, batch_id, line, holder, ok, result)

    def release_batch_line(self, batch_id: str, line: int, holder: str) -> bool:
        with self._write() as conn:
            return batches_table.release(conn, batch_id, line, holder)

    def requeue_batch_lines(self, batch_id: str, holder: str) -> int:
        with self._write() as conn:
            return batches_table.requeue(conn, batch_id, holder)

    def batch_results(self, batch_id: str) -> list[BatchLine]:
        with self._read() as conn:
            return batches_table.results(conn, batch_id)

    def purge_batches(self, project: str | None = None, now: float | None = None) -> int:
        with self._write() as conn:
            if project is not None:
                return batches_table.purge_project(conn, project)
            return batches_table.purge_expired(conn, _now(now))

    # -- results of `llmgw bench` (llmgw.store.benches) ----------------------------------------------------------
    def record_bench(self, record: BenchRecord) -> int:
        with self._write() as conn:
            return benches.insert(conn, record)

    def benches(self, replica: str | None = None, limit: int = 100) -> list[BenchRecord]:
        with self._read() as conn:
            return benches.latest(conn, replica, limit)

    # -- whole tables (copies between stores) --------------------------------------------------------------------
    def table_rows(self, table: str) -> Iterator[tuple]:
        """Every row of `table` (one of TABLES), columns in TABLES order, rows in a fixed order; bytes as bytes."""
        columns = TABLES[table]
        with self._read() as conn:
            rows = conn.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {TABLE_ORDER[table]}").fetchall()
        for row in rows:
            yield tuple(bytes(v) if isinstance(v, (memoryview, bytearray)) else v for v in row)

    def insert_rows(self, table: str, rows: Sequence[tuple]) -> None:
        """Insert `rows` (columns in TABLES order) into `table` in one transaction."""
        columns = TABLES[table]
        if not rows:
            return
        with self._write() as conn:
            conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                             rows)
            self._after_insert_rows(conn, table)

    def _after_insert_rows(self, conn: SqlConnection, table: str) -> None:
        """A backend's follow-up to an explicit-key insert (PostgreSQL moves the usage id sequence on)."""

"""`Store`: what the control plane, the gateway and the CLI need of the runtime store.

`SqliteStore` implements it for one control plane, `PostgresStore` for several sharing one database (both
through `sqlstore.SqlStore`). Every method is synchronous, thread-safe and may block on the database (SQLite: up
to its busy timeout while another process holds the write lock; PostgreSQL: the network): an event loop calls
it through `StoreBoundary` (worker threads), never directly.
Times are epoch seconds (`time.time()`); `now=None` means the current time.

Errors: `TemporaryError` when the database stayed locked past the busy timeout (retry later),
`StoreError` for anything else the database refuses, `UsageError` for wrong arguments.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

from llmgw.errors import UsageError
from llmgw.identity import Quota
from llmgw.store.records import (
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
from llmgw.store.batches import BatchLine, BatchRecord
from llmgw.store.benches import BenchRecord
from llmgw.store.files import FileRecord
from llmgw.store.responses import StoredResponse


@runtime_checkable
class Store(Protocol):
    """The runtime store: secrets, key/value, tokens of the admin listener, API keys, quotas, usage and leases."""

    url: str  # printable: a PostgreSQL URL's password is replaced by ***
    dialect: str  # "sqlite" or "postgresql"
    schema_version: int  # the migration the store is at (per backend: see schema.py, postgres_schema.py)

    def close(self) -> None:
        """Close the database; the store must not be used afterwards."""

    # -- secrets and key/value ------------------------------------------------------------------------------
    def get_or_create_secret(self, name: str, nbytes: int = 32) -> bytes:
        """The secret called `name`, made of `nbytes` random bytes on first use; the same bytes ever after
        (also across processes: the first writer wins)."""

    def get(self, key: str) -> str | None:
        """The value stored under `key`, or None."""

    def put(self, key: str, value: str) -> None:
        """Store `value` under `key`, replacing any previous value."""

    def swap(self, key: str, expected: str | None, value: str) -> bool:
        """Store `value` under `key` only if the value there is `expected` (None: no value at all), in one
        statement: True when it was stored, False when another writer got there first (read it again)."""

    # -- tokens of the admin listener (scopes: records.TOKEN_SCOPES) ----------------------------------------------
    def create_token(self, scope: str, name: str | None = None, expires_at: float | None = None,
                     now: float | None = None, owner: str | None = None) -> tuple[Token, str]:
        """A new token of `scope` belonging to `owner` (an account's e-mail; None: nobody's): (its record, the
        plaintext "llmgw-<scope>-..." shown once; only its SHA-256 digest is stored). Raises UsageError for a scope
        not in TOKEN_SCOPES, StoreError when `owner` has no active account."""

    def check_token(self, token: str, scope: str, now: float | None = None) -> bool:
        """True when `token` is an active token of `scope`, or of scope admin (which passes every check);
        False for anything else (malformed, unknown, revoked, expired, another scope). Digest compared in
        constant time. Raises UsageError for a scope not in TOKEN_SCOPES."""

    def find_token(self, token: str) -> Token | None:
        """The record of the token whose plaintext is `token` (revoked and expired ones too), or None (malformed or
        unknown). Digest compared in constant time."""

    def token_by_id(self, token_id: str) -> Token | None:
        """The record of token `token_id` (revoked and expired ones too), or None when there is none."""

    def list_tokens(self, scope: str | None = None) -> list[Token]:
        """Every token (of `scope`), oldest first, revoked and expired included."""

    def revoke_token(self, token_id: str, now: float | None = None) -> Token:
        """Revoke `token_id` (idempotent); returns its record. Raises StoreError for an unknown id."""

    def create_admin_token(self) -> str:
        """Shorthand: the plaintext of `create_token("admin")`."""

    def check_admin_token(self, token: str) -> bool:
        """Shorthand: `check_token(token, "admin")`."""

    # -- API keys ----------------------------------------------------------------------------------------------
    def create_api_key(self, project: str, name: str | None = None, expires_at: float | None = None,
                       now: float | None = None, created_by: str | None = None) -> tuple[ApiKey, str]:
        """A new API key for `project`, made by `created_by` (a person's e-mail; None: nobody's token or the CLI):
        (its record, the plaintext "sk-llmgw-..." shown once)."""

    def check_api_key(self, plaintext: str, now: float | None = None) -> KeyCheck:
        """Whether `plaintext` is an active key at `now`; if not, why (`KeyCheck.reason`, `.message`)."""

    def authenticate(self, plaintext: str, now: float | None = None) -> ApiKey | None:
        """The active key `plaintext` is, or None (unknown, malformed, revoked or expired: see check_api_key)."""

    def list_api_keys(self, project: str | None = None) -> list[ApiKey]:
        """Every key (of `project`), oldest first, revoked and expired included."""

    def revoke_api_key(self, key_id: str, now: float | None = None, by: str | None = None) -> ApiKey:
        """Revoke `key_id` by `by` (a person's e-mail, or None); idempotent: a revoked key keeps its first time and
        revoker. Returns its record. Raises StoreError for an unknown id."""

    # -- quotas ------------------------------------------------------------------------------------------------
    def reserve(self, scopes: Sequence[tuple[str, Quota]], estimated_tokens: int, estimated_cost: float,
                now: float | None = None) -> Reservation | Rejection:
        """Admit a request against every scope at once, or refuse it consuming nothing in any scope."""

    def reserve_many(self, requests: Sequence[tuple[Sequence[tuple[str, Quota]], int, float, float | None]]
                     ) -> list[Reservation | Rejection | UsageError]:
        """`reserve` of each (scopes, estimated_tokens, estimated_cost, now), in order, in one transaction (a group
        commit), each decided on what those before it left; a UsageError is returned, not raised, per request."""

    def settle(self, reservation: Reservation, actual_tokens: int, actual_cost: float, now: float | None = None,
               usage: UsageRecord | None = None) -> bool:
        """Replace the estimate by the actual usage, free the concurrency slots and (if given) record `usage`,
        in one durable transaction. False when the reservation was already settled or released."""

    def release(self, reservation: Reservation, now: float | None = None) -> bool:
        """Free the slots and refund the estimated tokens and cost (the request still counts as a request).
        False when already settled or released."""

    def renew(self, reservation: Reservation, now: float | None = None) -> bool:
        """Keep a long request's concurrency slots from expiring for another slot TTL; False if none is held."""

    def headroom(self, scopes: Sequence[tuple[str, Quota]], now: float | None = None) -> Headroom:
        """The tightest request and token allowances of `scopes` (a read)."""

    def quota_use(self, scopes: Sequence[tuple[str, Quota]], now: float | None = None) -> list[LimitUse]:
        """Every limit of `scopes` (scope key, limits) and what counts against it at `now`, read as the quota check
        reads it (`quotas.read_use`), in scope order then `quotas.LIMITS` order (a read)."""

    def apply_settlement(self, settlement: Settlement) -> bool:
        """Close the settlement's reservation and record its usage in one transaction, at most once per
        `settlement.entry_id`; False when that id was applied before (nothing written again)."""

    def apply_settlements(self, settlements: Sequence[Settlement]) -> list[bool]:
        """`apply_settlement` of each settlement in order, all in one transaction (a group commit: each whole or not
        at all, and the group too); one bool each, False for an entry id applied before or repeated in the group."""

    # -- usage -------------------------------------------------------------------------------------------------
    def record_usage(self, record: UsageRecord) -> None:
        """Append `record`; committed (surviving a crash of this process) before returning."""

    def record_usage_once(self, record: UsageRecord, request_id: str) -> bool:
        """Append `record` unless a record with `request_id` is there already (a Slurm job, "slurm:<cluster>:<id>");
        True when written. Committed before returning."""

    def query_usage(self, project: str | Sequence[str] | None = None, since: float | None = None,
                    by: str = "model", model: str | None = None) -> list[UsageRow]:
        """Usage summed per "model", "project" or "day" (UTC), of one project (or of several: a sequence of names),
        since a time and of one `model` if given."""

    def recent_usage(self, project: str | None = None, since: float | None = None,
                     limit: int = 100) -> list[UsageRecord]:
        """The latest `limit` records, newest first."""

    def usage_load(self, since: float, ttft_limit: int = 10000) -> UsageLoad:
        """The load of the records since `since` (unix seconds), for a forecast: per (model, project) sums, each
        model's busiest clock hour (UTC) and the TTFTs of its latest `ttft_limit` requests that have one."""

    def usage_of_replica(self, model: str, replica: str, settings_commit: str, since: float,
                         limit: int = 100000) -> list[UsageRecord]:
        """The records of `model`'s requests answered by `replica` started from `settings_commit`, since `since`
        (unix seconds), newest first, at most `limit` (a canary's requests: llmgw.control.canaries)."""

    def ttfts_of_model(self, model: str, since: float, limit: int = 10000) -> list[float]:
        """The times to first token (seconds; unstreamed: the duration) of `model`'s successful requests since
        `since` (unix seconds), batch lines left out, newest first, at most `limit` (the autoscaler's TTFT target:
        llmgw.control.autoscaling)."""

    def usage_of_request(self, request_id: str) -> UsageRecord | None:
        """The record of one gateway request (the gateway's own id, "req_" + 32 hex digits), or None when the store
        has none (yet)."""

    def usage_of_client_request(self, client_request_id: str, limit: int = 10) -> list[tuple[str, UsageRecord]]:
        """The records whose client sent `x-request-id: <client_request_id>` (not unique: a client may reuse one),
        newest first, at most `limit`, each with the gateway's own id of the request; [] when none."""

    # -- leases ------------------------------------------------------------------------------------------------
    def acquire_lease(self, name: str, holder: str, ttl_seconds: float, now: float | None = None) -> int:
        """Take or renew the lease `name` for `holder` until now + ttl_seconds (unix seconds).

        Returns its fencing token (>= 1) when `holder` holds it, 0 while another does. The token stays the same
        while one holder keeps or takes it again (a renewal, or a take after its own lease lapsed or was released:
        nobody else held it in between) and rises by one whenever another holder takes it, so a command carrying
        an older token comes from a deposed holder.
        """

    def release_lease(self, name: str, holder: str) -> bool:
        """Give the lease up if `holder` holds it; True when it did. Another holder's next take gets a higher token."""

    def lease_holder(self, name: str, now: float | None = None) -> str | None:
        """Who holds the lease `name` at `now`, or None."""

    def lease(self, name: str, now: float | None = None) -> Lease | None:
        """The lease `name` at `now` (holder, fencing token, expiry in unix seconds), None when nobody holds it."""

    # -- people's accounts (llmgw.store.accounts) -----------------------------------------------------------------
    def add_account(self, email: str, name: str, password: str, now: float | None = None) -> Account:
        """Make the account of `email` (stored in lower case) named `name` with `password` (only a scrypt hash is
        kept). Raises UsageError for a bad e-mail or a password under 12 characters, StoreError when the e-mail
        has an account."""

    def account(self, email: str) -> Account | None:
        """The account of `email` (disabled ones too), or None."""

    def list_accounts(self) -> list[Account]:
        """Every account, by e-mail."""

    def check_password(self, email: str, password: str) -> Account | None:
        """The active account of `email` when `password` is its password, else None (unknown, disabled, wrong).
        Costs one scrypt (0.15 s of CPU here) whatever the answer."""

    def set_password(self, email: str, password: str, now: float | None = None) -> Account:
        """Set a new password. Raises UsageError for a short one, StoreError for an unknown account."""

    def set_account_disabled(self, email: str, disabled: bool, now: float | None = None) -> Account:
        """Disable (the person can no longer log in, their tokens stop working) or enable an account. Raises
        StoreError for an unknown account."""

    # -- Linux users on Slurm nodes (llmgw.store.slurm_users) -------------------------------------------------------
    def slurm_users(self) -> list[SlurmUser]:
        """Every member ever given a login and UID, by UID (rows are never deleted)."""

    def assign_slurm_users(self, wanted: Sequence[tuple[str, Sequence[str]]], first_uid: int,
                           now: float | None = None) -> list[SlurmUser]:
        """Give each e-mail of `wanted` ((email, logins to try in order)) without a row the first free login and
        the next UID (one more than the highest ever given, at least `first_uid`), in one transaction; returns the
        rows of `wanted`'s e-mails in order. Raises StoreError when no offered login is free, or when another
        control plane assigned the same login or UID at the same moment (retry)."""

    # -- responses of /v1/responses (llmgw.store.responses) --------------------------------------------------------
    def save_response(self, stored: StoredResponse) -> None:
        """Keep `stored` until its `expires_at`; committed before returning."""

    def load_response(self, response_id: str, project: str, now: float | None = None) -> StoredResponse | None:
        """The response `response_id` of `project` while kept at `now`; None when absent, expired or another
        project's."""

    def delete_response(self, response_id: str, project: str) -> bool:
        """Delete the response `response_id` of `project`; True when one was there."""

    def purge_responses(self, project: str | None = None, now: float | None = None) -> int:
        """Delete every response of `project` (kept or not), or, with no project, every response expired at `now`;
        returns how many were deleted."""

    # -- files of /v1/files (llmgw.store.files) ------------------------------------------------------------------
    def save_file(self, record: FileRecord, data: bytes) -> None:
        """Keep `record` with its bytes `data` (in chunks) until its `expires_at`; committed before returning."""

    def file_record(self, file_id: str, project: str | None, now: float | None = None) -> FileRecord | None:
        """The file `file_id` of `project` (None: of any) while kept at `now`; None when absent, expired or another
        project's."""

    def list_files(self, project: str, purpose: str | None = None, after: str | None = None, limit: int = 10000,
                   newest_first: bool = True, now: float | None = None) -> list[FileRecord]:
        """Up to `limit` kept files of `project` (of `purpose`), by creation time, after the file `after`."""

    def file_content(self, file_id: str, project: str | None, now: float | None = None) -> bytes | None:
        """The bytes of the file `file_id` of `project` (None: of any) while kept; None as for `file_record`."""

    def delete_file(self, file_id: str, project: str) -> bool:
        """Delete the file `file_id` of `project` with its bytes; True when one was there."""

    def purge_files(self, project: str | None = None, now: float | None = None) -> int:
        """Delete every file of `project` (kept or not), or, with no project, every file expired at `now`; returns
        how many were deleted."""

    # -- batches of /v1/batches (llmgw.store.batches) ------------------------------------------------------------
    def create_batch(self, record: BatchRecord, lines: Sequence[BatchLine]) -> None:
        """Keep a new batch and its input lines, in one transaction."""

    def batch(self, batch_id: str, project: str | None = None, now: float | None = None) -> BatchRecord | None:
        """The batch `batch_id` (of `project` when given) while kept at `now`, its lines counted; None otherwise."""

    def list_batches(self, project: str, after: str | None = None, limit: int = 20,
                     now: float | None = None) -> list[BatchRecord]:
        """Up to `limit` kept batches of `project`, newest first, after the batch `after`."""

    def active_batches(self) -> list[BatchRecord]:
        """Every batch with work left (`batches.ACTIVE`), oldest first."""

    def update_batch(self, batch_id: str, expected: Sequence[str], status: str, body: dict,
                     outputs: Sequence[tuple[FileRecord, bytes]] = ()) -> bool:
        """Set the batch's status and body, and write `outputs` (its output and error files), in one transaction, if
        its status is one of `expected`; False (nothing written) when it is not."""

    def claim_batch_line(self, batch_id: str, holder: str, now: float | None = None) -> BatchLine | None:
        """Claim the batch's lowest pending line for `holder` (`batches.claim`); None when none is pending."""

    def send_batch_line(self, batch_id: str, line: int, holder: str, replica_id: str) -> bool:
        """Record that `holder` sends its claimed line to `replica_id` (`batches.send`); False when it is no longer
        `holder`'s (then it must not be sent)."""

    def finish_batch_line(self, batch_id: str, line: int, holder: str, ok: bool, result: str) -> bool:
        """Record a claimed line's result (`batches.finish`); False when it is no longer `holder`'s."""

    def release_batch_line(self, batch_id: str, line: int, holder: str) -> bool:
        """Hand back one line `holder` claimed and did not run (`batches.release`); False when it was not its."""

    def requeue_batch_lines(self, batch_id: str, holder: str) -> int:
        """Hand back the batch's lines running for another holder (`batches.requeue`); how many."""

    def batch_results(self, batch_id: str) -> list[BatchLine]:
        """The batch's finished lines, in input order."""

    def purge_batches(self, project: str | None = None, now: float | None = None) -> int:
        """Delete every batch of `project`, or, with no project, every batch kept until `now` or before, with their
        lines; returns how many batches."""

    # -- results of `llmgw bench` (llmgw.store.benches) ----------------------------------------------------------
    def record_bench(self, record: BenchRecord) -> int:
        """Keep one bench run (its `id` ignored); returns its id. Committed before returning."""

    def benches(self, replica: str | None = None, limit: int = 100) -> list[BenchRecord]:
        """The latest `limit` bench runs (of `replica` when given), newest first; [] when none."""

    # -- whole tables ------------------------------------------------------------------------------------------
    def table_rows(self, table: str) -> Iterator[tuple]:
        """Every row of `table` (a name of `sqlstore.TABLES`), its columns in that order, in a fixed order."""

    def insert_rows(self, table: str, rows: Sequence[tuple]) -> None:
        """Insert rows as `table_rows` gives them, in one transaction."""

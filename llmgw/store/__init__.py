"""llmgw.store: runtime state that is not settings (see DESIGN.md).

Secrets (the engine-key secret), key/value entries, people's accounts (scrypt password hashes), scoped tokens of the admin listener (each
optionally a person's), API key hashes, quota reservations,
usage records, leases, the responses served on /v1/responses and the files and batches of /v1/files and /v1/batches (kept for a retention), the Linux users made on Slurm nodes (never reused UIDs), and the results of `llmgw bench`. `open_store(url)` gives a `Store`: SQLite (WAL, one file) by default,
PostgreSQL (`postgresql://...`) for several control planes; `open_store_from_settings` opens what llmgw.yaml's
`store:` names; `store_record`/`write_store_record`/`read_store_record` keep which store a control plane uses in its
state directory (`store.json`, no password in it). `StoreBoundary` runs store calls off an event loop, with usage through a `UsageSpool`.
"""

from llmgw.store.accounts import MIN_PASSWORD_CHARS, normal_email
from llmgw.store.batches import BatchLine, BatchRecord, LineCounts
from llmgw.store.benches import BenchRecord
from llmgw.store.files import FileRecord
from llmgw.store.gpu_hours import HoursRow, ReplicaSize, gpu_hours
from llmgw.store.boundary import StoreBoundary
from llmgw.store.keys import ADMIN_TOKEN_PREFIX, API_KEY_PREFIX
from llmgw.store.opening import (
    STORE_FILE_NAME,
    STORE_RECORD_FILE,
    StoreRecord,
    open_store,
    open_store_from_settings,
    redacted,
    store_url_for_state,
    store_url_from_settings,
    read_store_record,
    store_record,
    with_password,
    without_password,
    write_store_record,
)
from llmgw.store.protocol import Store
from llmgw.store.quotas import window_bounds
from llmgw.store.records import (
    KEY_EXPIRED,
    KEY_FAILURE_MESSAGES,
    KEY_MALFORMED,
    KEY_REVOKED,
    KEY_UNKNOWN,
    SCOPE_ADMIN,
    Account,
    TOKEN_SCOPES,
    Allowance,
    ApiKey,
    Credential,
    CredentialState,
    Headroom,
    LimitUse,
    KeyCheck,
    Lease,
    Rejection,
    Reservation,
    Settlement,
    SlurmUser,
    Token,
    PairUsage,
    UsageLoad,
    UsageRecord,
    UsageRow,
    charged,
)
from llmgw.store.responses import DEFAULT_RETENTION_SECONDS, StoredResponse
from llmgw.store.schema import SCHEMA_VERSION
from llmgw.store.spool import UsageSpool
from llmgw.store.sqlite import SqliteStore

__all__ = [
    "HoursRow", "ReplicaSize", "gpu_hours",
    "Account", "MIN_PASSWORD_CHARS", "normal_email",
    "ADMIN_TOKEN_PREFIX", "BatchLine", "BatchRecord", "FileRecord", "LineCounts", "BenchRecord", "API_KEY_PREFIX", "KEY_EXPIRED", "KEY_FAILURE_MESSAGES", "KEY_MALFORMED",
    "KEY_REVOKED", "KEY_UNKNOWN", "SCHEMA_VERSION", "STORE_RECORD_FILE", "StoreRecord", "read_store_record",
    "store_record", "with_password", "without_password", "write_store_record", "SCOPE_ADMIN", "TOKEN_SCOPES", "Token", "STORE_FILE_NAME",
    "Allowance", "ApiKey", "Credential", "CredentialState", "Headroom", "KeyCheck", "Lease", "LimitUse", "Rejection", "Reservation", "Settlement", "SlurmUser", "SqliteStore",
    "Store", "StoreBoundary", "StoredResponse", "UsageRecord", "DEFAULT_RETENTION_SECONDS",
    "UsageRow", "PairUsage", "UsageLoad", "UsageSpool", "charged", "open_store", "open_store_from_settings", "redacted", "store_url_for_state", "store_url_from_settings", "window_bounds",
]

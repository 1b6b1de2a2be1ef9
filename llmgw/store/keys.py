"""API keys and tokens of the admin listener: made from random bytes, shown once, stored only as SHA-256 hashes.

An API key is `sk-llmgw-` followed by 32 random bytes in URL-safe base64 without padding (43 characters).
A token is `llmgw-<scope>-` followed by the same (`llmgw-admin-...`, `llmgw-review-...`; scopes in
`records.TOKEN_SCOPES`); the scope that counts is the stored one, the prefix only helps people tell tokens apart. The store keeps the SHA-256 digest of the whole
string and looks it up by that digest through an SQL parameter, so neither the key nor its digest is ever
part of an SQL statement's text, and the plaintext never reaches the database at all. The digest found is compared
again with `hmac.compare_digest`.

Functions taking a connection run inside the caller's transaction.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Generic, TypeVar

from llmgw.errors import StoreError, UsageError
from llmgw.store.dialects import SqlConnection
from llmgw.store.records import (
    KEY_EXPIRED,
    KEY_MALFORMED,
    KEY_REVOKED,
    KEY_UNKNOWN,
    SCOPE_ADMIN,
    TOKEN_SCOPES,
    ApiKey,
    Credential,
    CredentialState,
    KeyCheck,
    Token,
)

API_KEY_PREFIX = "sk-llmgw-"
ADMIN_TOKEN_PREFIX = "llmgw-admin-"  # token_prefix(SCOPE_ADMIN)
SECRET_BYTES = 32
_ENCODED_LENGTH = 43  # base64url of 32 bytes, unpadded
_DISPLAY_CHARS = 4  # characters of the secret part kept as a visible prefix


def new_token(prefix: str) -> str:
    """`prefix` followed by 32 random bytes from `secrets` in unpadded URL-safe base64."""
    return prefix + base64.urlsafe_b64encode(secrets.token_bytes(SECRET_BYTES)).rstrip(b"=").decode("ascii")


def digest(token: str) -> bytes:
    """The SHA-256 digest (32 bytes) of `token` encoded as UTF-8: what the store keeps."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def well_formed(token: str, prefix: str) -> bool:
    """True when `token` has `prefix` and exactly the length and alphabet of a token made by `new_token`."""
    if not token.startswith(prefix) or len(token) != len(prefix) + _ENCODED_LENGTH:
        return False
    body = token[len(prefix):]
    return all(c.isascii() and (c.isalnum() or c in "-_") for c in body)


C = TypeVar("C", bound=Credential)


@dataclass(frozen=True)
class _Table(Generic[C]):
    """How one kind of `Credential` is stored: its `table`, whose rows are `_COLUMNS` with the `group` column (what
    it belongs to) second, then the `extra` columns of that kind (fields of its record by the same name) and then the
    digest; its record type; its id (`id_prefix` and `id_bytes` random bytes in hex); what a person calls it and
    the command that lists the ids."""

    table: str
    group: str
    record: type[C]
    id_prefix: str
    id_bytes: int
    noun: str
    lister: str
    extra: tuple[str, ...] = ()

    @property
    def columns(self) -> str:
        return ", ".join((f"id, {self.group}, name, prefix, created_at, expires_at, revoked_at", *self.extra))

    def record_of(self, row: tuple) -> C:
        return self.record(row[0], row[1], name=row[2], prefix=row[3], created_at=row[4], expires_at=row[5],
                           revoked_at=row[6], **dict(zip(self.extra, row[7:7 + len(self.extra)])))


_API_KEYS: _Table[ApiKey] = _Table("api_keys", "project", ApiKey, "key_", 4, "API key", "llmgw keys list",
                                   ("created_by", "revoked_by"))
_TOKENS: _Table[Token] = _Table("tokens", "scope", Token, "tok_", 6, "token", "llmgw token list", ("owner",))


def _insert(conn: SqlConnection, kind: _Table[C], group: str, name: str | None, expires_at: float | None, now: float,
            prefix: str, extra: tuple = ()) -> tuple[C, str]:
    """Store a new credential of `kind` whose plaintext starts with `prefix` (`extra`: the values of its extra
    columns); returns (record, plaintext)."""
    plaintext = new_token(prefix)
    shown = plaintext[: len(prefix) + _DISPLAY_CHARS]
    marks = ", ".join("?" * len(kind.extra))
    for _attempt in range(8):
        credential_id = kind.id_prefix + secrets.token_hex(kind.id_bytes)
        inserted = conn.execute(
            f"INSERT INTO {kind.table} ({kind.columns}, hash) VALUES (?, ?, ?, ?, ?, ?, NULL, {marks + ', ' if marks else ''}?) "
            "ON CONFLICT DO NOTHING RETURNING id",
            (credential_id, group, name, shown, now, expires_at, *extra, digest(plaintext)),
        ).fetchone()
        if inserted is not None:  # None: an id collision (1 in 4 billion for keys): draw another id
            return kind.record_of((credential_id, group, name, shown, now, expires_at, None, *extra)), plaintext
    raise StoreError(f"Could not draw a free {kind.noun} id after 8 attempts; the {kind.table} table looks corrupt.")


def _find(conn: SqlConnection, kind: _Table[C], plaintext: str) -> C | None:
    """The record of `kind` whose digest is that of `plaintext` (revoked and expired ones too), or None."""
    presented = digest(plaintext)
    row = conn.execute(f"SELECT {kind.columns}, hash FROM {kind.table} WHERE hash = ?", (presented,)).fetchone()
    if row is None or not hmac.compare_digest(bytes(row[7 + len(kind.extra)]), presented):
        return None
    return kind.record_of(row)


def _list(conn: SqlConnection, kind: _Table[C], group: str | None) -> list[C]:
    """Every record of `kind` (belonging to `group`, if given), oldest first, revoked and expired ones included."""
    where, parameters = ("", ()) if group is None else (f" WHERE {kind.group} = ?", (group,))
    rows = conn.execute(f"SELECT {kind.columns} FROM {kind.table}{where} ORDER BY created_at, id",
                        parameters).fetchall()
    return [kind.record_of(row) for row in rows]


def _revoke(conn: SqlConnection, kind: _Table[C], credential_id: str, now: float, by: str | None = None) -> C:
    """Mark `credential_id` revoked at `now`, by `by` when its kind records who revokes (`revoked_by`); one revoked
    before keeps its first time and revoker. Raises StoreError if unknown."""
    who = "revoked_by" in kind.extra
    conn.execute(f"UPDATE {kind.table} SET revoked_at = ?{', revoked_by = ?' if who else ''} WHERE id = ? "
                 "AND revoked_at IS NULL", (now, *((by,) if who else ()), credential_id))
    row = conn.execute(f"SELECT {kind.columns} FROM {kind.table} WHERE id = ?", (credential_id,)).fetchone()
    if row is None:
        raise StoreError(f"There is no {kind.noun} {credential_id!r}; `{kind.lister}` shows the ids.")
    return kind.record_of(row)


def insert_api_key(conn: SqlConnection, project: str, name: str | None, expires_at: float | None,
                   now: float, created_by: str | None = None) -> tuple[ApiKey, str]:
    """Create a key for `project`, made by `created_by` (a person's e-mail, None: nobody's); returns (record,
    plaintext). The plaintext is not kept anywhere."""
    if not project:
        raise StoreError("An API key needs a project; pass the name of a project of projects.yaml.")
    return _insert(conn, _API_KEYS, project, name, expires_at, now, API_KEY_PREFIX, (created_by, None))


def check_api_key(conn: SqlConnection, plaintext: str, now: float) -> KeyCheck:
    """Look a presented key up by its digest; the result says whether it is accepted and, if not, why."""
    if not well_formed(plaintext, API_KEY_PREFIX):
        return KeyCheck(None, KEY_MALFORMED)
    key = _find(conn, _API_KEYS, plaintext)
    if key is None:
        return KeyCheck(None, KEY_UNKNOWN)
    state = key.state(now)
    if state is CredentialState.REVOKED:
        return KeyCheck(None, KEY_REVOKED)
    if state is CredentialState.EXPIRED:
        return KeyCheck(None, KEY_EXPIRED)
    return KeyCheck(key)


def list_api_keys(conn: SqlConnection, project: str | None) -> list[ApiKey]:
    """Every key (of `project`, if given), oldest first, revoked and expired ones included."""
    return _list(conn, _API_KEYS, project)


def revoke_api_key(conn: SqlConnection, key_id: str, now: float, by: str | None = None) -> ApiKey:
    """Mark `key_id` revoked at `now` by `by` (a person's e-mail, None: nobody's); a key revoked before keeps its
    first time and revoker. Raises StoreError if unknown."""
    return _revoke(conn, _API_KEYS, key_id, now, by)


def token_prefix(scope: str) -> str:
    """The plaintext prefix of a token of `scope`: "llmgw-<scope>-" ("llmgw-admin-" for admin tokens)."""
    return f"llmgw-{scope}-"


def _check_scope(scope: str) -> None:
    if scope not in TOKEN_SCOPES:
        raise UsageError(f"There is no token scope {scope!r}; the scopes are {', '.join(TOKEN_SCOPES)}.")


def insert_token(conn: SqlConnection, scope: str, name: str | None, expires_at: float | None,
                 now: float, owner: str | None = None) -> tuple[Token, str]:
    """Create a token of `scope` (one of TOKEN_SCOPES) belonging to `owner` (an account's e-mail, None: nobody);
    returns (record, plaintext). Only its digest is stored.

    Raises UsageError for an unknown scope, StoreError when `owner` has no account or a disabled one.
    """
    _check_scope(scope)
    if owner is not None:
        row = conn.execute("SELECT disabled_at FROM accounts WHERE email = ?", (owner,)).fetchone()
        if row is None or row[0] is not None:
            raise StoreError(f"{owner} has {'no account' if row is None else 'a disabled account'}: a token "
                             "belongs to a person with an active account (`llmgw users add`, `llmgw users list`).")
    return _insert(conn, _TOKENS, scope, name, expires_at, now, token_prefix(scope), (owner,))


def find_token(conn: SqlConnection, plaintext: str) -> Token | None:
    """The token record whose digest is that of `plaintext` (revoked and expired ones too), or None.

    Only strings shaped like a token of some scope ("llmgw-<scope>-" and 43 characters) are looked up.
    """
    if not any(well_formed(plaintext, token_prefix(scope)) for scope in TOKEN_SCOPES):
        return None
    return _find(conn, _TOKENS, plaintext)


def token_by_id(conn: SqlConnection, token_id: str) -> Token | None:
    """The token record `token_id` (revoked and expired ones too), or None when there is none."""
    row = conn.execute(f"SELECT {_TOKENS.columns} FROM {_TOKENS.table} WHERE id = ?", (token_id,)).fetchone()
    return None if row is None else _TOKENS.record_of(row)


def check_token(conn: SqlConnection, plaintext: str, scope: str, now: float) -> bool:
    """True when `plaintext` is an active token (not revoked, not expired at `now`) of `scope` or of scope admin.

    Raises UsageError for an unknown `scope` (a bug of the caller, not of the token).
    """
    _check_scope(scope)
    token = find_token(conn, plaintext)
    return (token is not None and token.state(now) is CredentialState.ACTIVE
            and token.scope in (scope, SCOPE_ADMIN))


def list_tokens(conn: SqlConnection, scope: str | None) -> list[Token]:
    """Every token (of `scope`, if given), oldest first, revoked and expired ones included."""
    if scope is not None:
        _check_scope(scope)
    return _list(conn, _TOKENS, scope)


def revoke_token(conn: SqlConnection, token_id: str, now: float) -> Token:
    """Mark `token_id` revoked at `now` (a token revoked before keeps its first time). Raises StoreError if unknown."""
    return _revoke(conn, _TOKENS, token_id, now)


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


def _row_to_key(row: tuple) -> ApiKey:
    return ApiKey(key_id=row[0], project=row[1], name=row[2], prefix=row[3], created_at=row[4],
                  expires_at=row[5], revoked_at=row[6])


_KEY_COLUMNS = "id, project, name, prefix, created_at, expires_at, revoked_at"


def insert_api_key(conn: SqlConnection, project: str, name: str | None, expires_at: float | None,
                   now: float) -> tuple[ApiKey, str]:
    """Create a key for `project`; returns (record, plaintext). The plaintext is not kept anywhere."""
    if not project:
        raise StoreError("An API key needs a project; pass the name of a project of projects.yaml.")
    plaintext = new_token(API_KEY_PREFIX)
    shown = plaintext[: len(API_KEY_PREFIX) + _DISPLAY_CHARS]
    for _attempt in range(8):
        key_id = "key_" + secrets.token_hex(4)
        inserted = conn.execute(
            f"INSERT INTO api_keys ({_KEY_COLUMNS}, hash) VALUES (?, ?, ?, ?, ?, ?, NULL, ?) ON CONFLICT DO NOTHING "
            "RETURNING id",
            (key_id, project, name, shown, now, expires_at, digest(plaintext)),
        ).fetchone()
        if inserted is None:
            continue  # id collision (1 in 4 billion): draw another id
        return ApiKey(key_id=key_id, project=project, name=name, prefix=shown, created_at=now,
                      expires_at=expires_at), plaintext
    raise StoreError("Could not draw a free API key id after 8 attempts; the api_keys table looks corrupt.")


def check_api_key(conn: SqlConnection, plaintext: str, now: float) -> KeyCheck:
    """Look a presented key up by its digest; the result says whether it is accepted and, if not, why."""
    if not well_formed(plaintext, API_KEY_PREFIX):
        return KeyCheck(None, KEY_MALFORMED)
    presented = digest(plaintext)
    row = conn.execute(f"SELECT {_KEY_COLUMNS}, hash FROM api_keys WHERE hash = ?", (presented,)).fetchone()
    if row is None or not hmac.compare_digest(bytes(row[7]), presented):
        return KeyCheck(None, KEY_UNKNOWN)
    key = _row_to_key(row)
    state = key.state(now)
    if state is CredentialState.REVOKED:
        return KeyCheck(None, KEY_REVOKED)
    if state is CredentialState.EXPIRED:
        return KeyCheck(None, KEY_EXPIRED)
    return KeyCheck(key)


def list_api_keys(conn: SqlConnection, project: str | None) -> list[ApiKey]:
    """Every key (of `project`, if given), oldest first, revoked and expired ones included."""
    if project is None:
        rows = conn.execute(f"SELECT {_KEY_COLUMNS} FROM api_keys ORDER BY created_at, id").fetchall()
    else:
        rows = conn.execute(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE project = ? ORDER BY created_at, id",
                            (project,)).fetchall()
    return [_row_to_key(row) for row in rows]


def revoke_api_key(conn: SqlConnection, key_id: str, now: float) -> ApiKey:
    """Mark `key_id` revoked at `now` (a key revoked before keeps its first time). Raises StoreError if unknown."""
    conn.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (now, key_id))
    row = conn.execute(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    if row is None:
        raise StoreError(f"There is no API key {key_id!r}; `llmgw keys list` shows the ids.")
    return _row_to_key(row)


def token_prefix(scope: str) -> str:
    """The plaintext prefix of a token of `scope`: "llmgw-<scope>-" ("llmgw-admin-" for admin tokens)."""
    return f"llmgw-{scope}-"


def _check_scope(scope: str) -> None:
    if scope not in TOKEN_SCOPES:
        raise UsageError(f"There is no token scope {scope!r}; the scopes are {', '.join(TOKEN_SCOPES)}.")


def _row_to_token(row: tuple) -> Token:
    return Token(token_id=row[0], scope=row[1], name=row[2], prefix=row[3], created_at=row[4],
                 expires_at=row[5], revoked_at=row[6])


_TOKEN_COLUMNS = "id, scope, name, prefix, created_at, expires_at, revoked_at"


def insert_token(conn: SqlConnection, scope: str, name: str | None, expires_at: float | None,
                 now: float) -> tuple[Token, str]:
    """Create a token of `scope` (one of TOKEN_SCOPES); returns (record, plaintext). Only its digest is stored.

    Raises UsageError for an unknown scope.
    """
    _check_scope(scope)
    prefix = token_prefix(scope)
    plaintext = new_token(prefix)
    shown = plaintext[: len(prefix) + _DISPLAY_CHARS]
    for _attempt in range(8):
        token_id = "tok_" + secrets.token_hex(6)
        inserted = conn.execute(
            f"INSERT INTO tokens ({_TOKEN_COLUMNS}, hash) VALUES (?, ?, ?, ?, ?, ?, NULL, ?) ON CONFLICT DO NOTHING "
            "RETURNING id",
            (token_id, scope, name, shown, now, expires_at, digest(plaintext)),
        ).fetchone()
        if inserted is not None:
            return Token(token_id=token_id, scope=scope, name=name, prefix=shown, created_at=now,
                         expires_at=expires_at), plaintext
    raise StoreError("Could not draw a free token id after 8 attempts; the tokens table looks corrupt.")


def find_token(conn: SqlConnection, plaintext: str) -> Token | None:
    """The token record whose digest is that of `plaintext` (revoked and expired ones too), or None.

    Only strings shaped like a token of some scope ("llmgw-<scope>-" and 43 characters) are looked up.
    """
    if not any(well_formed(plaintext, token_prefix(scope)) for scope in TOKEN_SCOPES):
        return None
    presented = digest(plaintext)
    row = conn.execute(f"SELECT {_TOKEN_COLUMNS}, hash FROM tokens WHERE hash = ?", (presented,)).fetchone()
    if row is None or not hmac.compare_digest(bytes(row[7]), presented):
        return None
    return _row_to_token(row)


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
    if scope is None:
        rows = conn.execute(f"SELECT {_TOKEN_COLUMNS} FROM tokens ORDER BY created_at, id").fetchall()
    else:
        _check_scope(scope)
        rows = conn.execute(f"SELECT {_TOKEN_COLUMNS} FROM tokens WHERE scope = ? ORDER BY created_at, id",
                            (scope,)).fetchall()
    return [_row_to_token(row) for row in rows]


def revoke_token(conn: SqlConnection, token_id: str, now: float) -> Token:
    """Mark `token_id` revoked at `now` (a token revoked before keeps its first time). Raises StoreError if unknown."""
    conn.execute("UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (now, token_id))
    row = conn.execute(f"SELECT {_TOKEN_COLUMNS} FROM tokens WHERE id = ?", (token_id,)).fetchone()
    if row is None:
        raise StoreError(f"There is no token {token_id!r}; `llmgw token list` shows the ids.")
    return _row_to_token(row)

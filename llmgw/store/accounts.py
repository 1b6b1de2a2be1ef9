"""People's local accounts: an e-mail (lower case, the key: what projects.yaml names), a name, and a scrypt hash of
the password (Python's `hashlib.scrypt`, OpenSSL's; RFC 7914), never the password itself.

A stored hash reads `scrypt$<n>$<r>$<p>$<salt>$<digest>` (salt and digest in unpadded URL-safe base64), so its cost
can be raised later without breaking the hashes already kept: each is checked with the parameters it was made
with. Passwords are at least MIN_PASSWORD_CHARS characters. What a person may do is not here: it follows the
settings (projects.yaml `people` and project `members`, `llmgw.settings.Settings.access_of`).

Functions taking a connection run inside the caller's transaction. Checking a password costs one scrypt (0.15 s
of CPU and 32 MiB, measured on this 2-core machine): callers run it in a worker thread, and an unknown e-mail costs the same as a wrong
password, so answer times do not tell which e-mails have accounts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

from llmgw.errors import StoreError, UsageError
from llmgw.store.dialects import SqlConnection
from llmgw.store.records import Account

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2 ** 15, 8, 1
"""scrypt's cost for new hashes: 32 MiB (128 * n * r bytes) and 0.15 s of CPU per hash, measured on this 2-core machine."""
MIN_PASSWORD_CHARS = 12
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
_COLUMNS = "email, name, created_at, password_changed_at, disabled_at"


def normal_email(email: str) -> str:
    """`email` stripped and in lower case. Raises UsageError when it is not shaped like an e-mail address."""
    value = email.strip().lower()
    if not _EMAIL.match(value):
        raise UsageError(f"{email!r} is not an e-mail address; accounts are named by e-mail (as projects.yaml "
                         "names members).")
    return value


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=2 * 128 * n * r * p + (1 << 20),
                          dklen=32)


def hash_password(password: str) -> str:
    """A new salted scrypt hash of `password` (the stored form above). Raises UsageError for a password shorter
    than MIN_PASSWORD_CHARS."""
    if len(password) < MIN_PASSWORD_CHARS:
        raise UsageError(f"A password needs at least {MIN_PASSWORD_CHARS} characters; this one has {len(password)}.")
    salt = secrets.token_bytes(16)
    return "$".join(("scrypt", str(SCRYPT_N), str(SCRYPT_R), str(SCRYPT_P), _b64(salt),
                     _b64(_scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P))))


def password_matches(password: str, stored: str) -> bool:
    """Whether `password` is the one `stored` (a hash of `hash_password`) was made from; False for a malformed
    hash. Compared in constant time."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != "scrypt" or not all(p.isdigit() for p in parts[1:4]):
        return False
    n, r, p = (int(x) for x in parts[1:4])
    return hmac.compare_digest(_scrypt(password, _unb64(parts[4]), n, r, p), _unb64(parts[5]))


def _decoy() -> str:
    """A hash no password matches, at the cost of new hashes: a login for an unknown e-mail costs what one for a
    known e-mail costs (built at each use, so it follows SCRYPT_N, which the test suite lowers)."""
    return "$".join(("scrypt", str(SCRYPT_N), str(SCRYPT_R), str(SCRYPT_P), _b64(b"\0" * 16), _b64(b"\0" * 32)))
"""A hash no password matches, checked for unknown e-mails so they cost what a wrong password costs."""


def _account(row: tuple) -> Account:
    return Account(row[0], row[1], float(row[2]), float(row[3]), None if row[4] is None else float(row[4]))


def insert_account(conn: SqlConnection, email: str, name: str, hashed: str, now: float) -> Account:
    """Make the account of `email` (normalised) named `name` (empty: the e-mail) with the password hash `hashed`
    (`hash_password`). Raises UsageError for a bad e-mail, StoreError when the e-mail has an account already."""
    email = normal_email(email)
    name = name.strip() or email
    row = conn.execute("INSERT INTO accounts (email, name, password, created_at, password_changed_at) "
                       "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING email",
                       (email, name, hashed, now, now)).fetchone()
    if row is None:
        raise StoreError(f"{email} has an account already; `llmgw users passwd {email}` sets a new password.")
    return Account(email, name, now, now)


def find_account(conn: SqlConnection, email: str) -> Account | None:
    """The account of `email` (disabled ones too), or None."""
    row = conn.execute(f"SELECT {_COLUMNS} FROM accounts WHERE email = ?", (email.strip().lower(),)).fetchone()
    return None if row is None else _account(row)


def list_accounts(conn: SqlConnection) -> list[Account]:
    """Every account, by e-mail."""
    return [_account(row) for row in conn.execute(f"SELECT {_COLUMNS} FROM accounts ORDER BY email").fetchall()]


def password_row(conn: SqlConnection, email: str) -> tuple | None:
    """The account row of `email` with its password hash last (for `matching`), or None."""
    return conn.execute(f"SELECT {_COLUMNS}, password FROM accounts WHERE email = ?",
                        (email.strip().lower(),)).fetchone()


def matching(row: tuple | None, password: str) -> Account | None:
    """The active account of `row` (`password_row`) when `password` is its password; None otherwise (no row,
    disabled, wrong password). A missing row costs one scrypt too."""
    matches = password_matches(password, _decoy() if row is None else row[5])
    if row is None or not matches or row[4] is not None:
        return None
    return _account(row)


def _changed(conn: SqlConnection, email: str, sql: str, params: tuple) -> Account:
    email = email.strip().lower()
    if conn.execute(sql + " RETURNING email", params + (email,)).fetchone() is None:
        raise StoreError(f"There is no account {email!r}; `llmgw users list` shows them.")
    account = find_account(conn, email)
    assert account is not None
    return account


def set_password(conn: SqlConnection, email: str, hashed: str, now: float) -> Account:
    """Replace the password hash of `email`'s account by `hashed` (`hash_password`). Raises StoreError when there
    is no such account."""
    return _changed(conn, email, "UPDATE accounts SET password = ?, password_changed_at = ? WHERE email = ?",
                    (hashed, now))


def set_disabled(conn: SqlConnection, email: str, disabled: bool, now: float) -> Account:
    """Disable (keeping the first time) or enable `email`'s account; a disabled account's tokens stop working too
    (the admin API and the console refuse a token whose owner's account is disabled). Raises StoreError if
    unknown."""
    if disabled:
        return _changed(conn, email, "UPDATE accounts SET disabled_at = coalesce(disabled_at, ?) WHERE email = ?",
                        (now,))
    return _changed(conn, email, "UPDATE accounts SET disabled_at = NULL WHERE email = ?", ())

"""Opening a store from a URL, a path, or the `store:` settings of llmgw.yaml; and the record of which store a
control plane uses, kept in its state directory (`StoreRecord`, `<state>/store.json`) so that `llmgw keys`,
`llmgw token`, `llmgw usage` and `llmgw store` find that store from `--state DIR` alone:

    {"url": "postgresql://llmgw@db:5432/llmgw", "password_secret": "store-password", "secrets_dir": "/etc/llmgw"}

`url` never holds a password; `password_secret` names the secret holding it (looked up the way the control plane
does: `<secrets_dir>/<name>`, else `$LLMGW_SECRET_<NAME>`), null when there is none; `secrets_dir` is the control
plane's secrets directory (null: `<state>/secrets`). A SQLite store's url is its absolute path.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from llmgw.errors import StoreError
from llmgw.store.protocol import Store
from llmgw.store.sqlite import DEFAULT_BUSY_TIMEOUT, DEFAULT_SLOT_TTL, SqliteStore

STORE_FILE_NAME = "llmgw.sqlite3"
STORE_RECORD_FILE = "store.json"
POSTGRES_SCHEMES = ("postgresql", "postgres")


@dataclass(frozen=True)
class StoreRecord:
    """Which store a control plane opened (see the module docstring): `url` without a password, the name of the
    secret holding it (`password_secret`, None: none) and the control plane's secrets directory (None: default)."""

    url: str
    password_secret: str | None = None
    secrets_dir: str | None = None


def without_password(url: str) -> str:
    """`url` with any password removed from its authority (the user stays); a path is returned unchanged."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url
    user = userinfo.partition(":")[0]
    return urlunsplit((parts.scheme, f"{user}@{host}" if user else host, parts.path, parts.query, parts.fragment))


def with_password(url: str, password: str) -> str:
    """`url` (postgresql://user@host/db) with `password` put in its authority, percent-encoded."""
    parts = urlsplit(url)
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{quote(user, safe='')}:{quote(password, safe='')}@{host}", parts.path,
                       parts.query, parts.fragment))


def store_record(store_settings, state_dir: str | Path, override_url: str | Path | None = None,
                 secrets_dir: str | Path | None = None) -> StoreRecord:
    """The record of the store `open_store_from_settings(store_settings, state_dir, override_url=...)` opens.
    Pure (no secret is read). Raises StoreError as `store_url_from_settings` does."""
    if override_url is not None:
        url = str(override_url)
        if "://" not in url:
            url = str(Path(url).expanduser().resolve())
        return StoreRecord(without_password(url), None, str(secrets_dir) if secrets_dir else None)
    secret = getattr(store_settings, "password_secret", None) if store_settings is not None else None
    if store_settings is None:
        url = str(Path(state_dir).resolve() / STORE_FILE_NAME)
    else:
        plain = store_settings
        if secret:  # the URL without the password: the record names the secret instead
            plain = (dataclasses.replace(store_settings, password_secret=None) if dataclasses.is_dataclass(store_settings)
                     else type("Plain", (), {**vars(store_settings), "password_secret": None})())
        url = store_url_from_settings(plain, Path(state_dir).resolve())
    return StoreRecord(without_password(url), secret or None, str(secrets_dir) if secrets_dir else None)


def write_store_record(state_dir: str | Path, record: StoreRecord) -> None:
    """Write `record` to `<state_dir>/store.json` (replaced atomically). Raises OSError when it cannot be written."""
    path = Path(state_dir) / STORE_RECORD_FILE
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(json.dumps(dataclasses.asdict(record), indent=1) + "\n")
    os.replace(temporary, path)


def read_store_record(state_dir: str | Path) -> StoreRecord | None:
    """The record in `<state_dir>/store.json`, or None when there is none. Raises StoreError naming the file when it
    does not parse."""
    path = Path(state_dir) / STORE_RECORD_FILE
    try:
        data = json.loads(path.read_text())
        return StoreRecord(str(data["url"]), data.get("password_secret") or None, data.get("secrets_dir") or None)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{path} does not say which store this control plane uses ({exc}); start the control "
                         "plane again to rewrite it, or pass --store URL.") from exc


def store_url_for_state(state_dir: str | Path) -> str:
    """The store of a state directory (`llmgw up`'s `.state/`): `<state_dir>/llmgw.sqlite3`."""
    return str(Path(state_dir) / STORE_FILE_NAME)


def redacted(url: str | Path) -> str:
    """`url` as it may be printed: the password of any URL (mistyped schemes too) replaced by *** (paths unchanged)."""
    text = str(url)
    if "://" in text:
        from llmgw.store.postgres import redact_url

        return redact_url(text)
    return text


def open_store(url: str | Path, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
               slot_ttl: float = DEFAULT_SLOT_TTL, migrate: bool = True) -> Store:
    """Open (creating if missing, migrating if older unless `migrate` is False) the store at `url`.

    `url` is a filesystem path (relative or absolute) or `sqlite:///ABSOLUTE/PATH` (`sqlite:////...` is
    accepted too): a SQLite file in WAL mode; or `postgresql://user:password@host:port/database` (also
    `postgres://`, `postgresql+psycopg://`; libpq's query parameters such as `?options=-csearch_path%3Dname`
    pass through): a PostgreSQL database. `busy_timeout` and `slot_ttl` are seconds (see SqliteStore).
    Raises StoreError for an unsupported URL, a database that cannot be reached or used (a sentence naming the
    URL, its password replaced by ***, and the error), or a schema newer than this llmgw's (both versions named).
    """
    text = str(url)
    if "://" not in text:
        if not text or text == ":memory:":
            raise StoreError(f"{text!r} is not a store path; give a file path such as .state/{STORE_FILE_NAME}.")
        return SqliteStore(Path(text).expanduser(), busy_timeout=busy_timeout, slot_ttl=slot_ttl, migrate=migrate)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        if parts.netloc or not parts.path or parts.path == "/":
            raise StoreError(f"The store URL {redacted(text)!r} has no file path; write sqlite:///absolute/path/{STORE_FILE_NAME}.")
        return SqliteStore(Path(parts.path), busy_timeout=busy_timeout, slot_ttl=slot_ttl, migrate=migrate)
    if scheme.split("+")[0] in POSTGRES_SCHEMES:
        from llmgw.store.postgres import PostgresStore

        return PostgresStore(urlunsplit(("postgresql", *parts[1:])), busy_timeout=busy_timeout, slot_ttl=slot_ttl,
                             migrate=migrate)
    raise StoreError(f"Unknown store URL scheme {parts.scheme!r} in {redacted(text)!r}; use a path, sqlite:///path "
                     "or postgresql://user@host/database.")


def store_url_from_settings(store_settings, state_dir: str | Path,
                            secrets_get: Callable[[str], str | None] | None = None) -> str:
    """The store URL that llmgw.yaml's `store:` names (see docs/store.md).

    `store_settings` has `kind` ("sqlite" or "postgresql") and, read when present: `path` (SQLite, relative to
    `state_dir`), `url` (PostgreSQL), or `host`, `port`, `database`, `user` and `password_secret` (PostgreSQL,
    when no `url`). `secrets_get(name)` gives a named secret (the PostgreSQL password) or None.
    Raises StoreError for an unknown kind, a PostgreSQL store without url or host, or a secret that is missing.
    """
    kind = getattr(store_settings, "kind", "sqlite") or "sqlite"
    if kind == "sqlite":
        path = Path(getattr(store_settings, "path", None) or STORE_FILE_NAME).expanduser()
        return str(path if path.is_absolute() else Path(state_dir) / path)
    if kind != "postgresql":
        raise StoreError(f"llmgw.yaml store.kind is {kind!r}; use sqlite or postgresql.")
    url = getattr(store_settings, "url", None)
    secret_name = getattr(store_settings, "password_secret", None)
    password = None
    if secret_name:
        password = secrets_get(secret_name) if secrets_get is not None else None
        if not password:
            raise StoreError(f"llmgw.yaml store.password_secret names the secret {secret_name!r}, which this "
                             "control plane does not have; add it to its secrets directory or environment.")
    if url:
        return url if password is None else with_password(url, password)
    host = getattr(store_settings, "host", None)
    if not host:
        raise StoreError("llmgw.yaml store.kind is postgresql but neither store.url nor store.host is set.")
    user = getattr(store_settings, "user", None) or ""
    port = getattr(store_settings, "port", None)
    database = getattr(store_settings, "database", None) or getattr(store_settings, "db", None) or ""
    userinfo = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "")
    netloc = (f"{userinfo}@" if userinfo else "") + (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    return urlunsplit(("postgresql", netloc, "/" + quote(database, safe=""), "", ""))


def open_store_from_settings(store_settings, state_dir: str | Path,
                             secrets_get: Callable[[str], str | None] | None = None, *,
                             override_url: str | Path | None = None, **options) -> Store:
    """Open the store that llmgw.yaml's `store:` names, or `override_url` (`--store URL`) when given.

    `store_settings`, `state_dir` and `secrets_get` as in `store_url_from_settings`; `store_settings` None
    means the default (SQLite `llmgw.sqlite3` in `state_dir`). `options` go to `open_store`. Raises StoreError
    as `open_store` and `store_url_from_settings` do.
    """
    if override_url is not None:
        return open_store(override_url, **options)
    if store_settings is None:
        return open_store(Path(state_dir) / STORE_FILE_NAME, **options)
    return open_store(store_url_from_settings(store_settings, state_dir, secrets_get), **options)

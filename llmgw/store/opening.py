"""Opening a store from a URL or a path."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from llmgw.errors import StoreError
from llmgw.store.protocol import Store
from llmgw.store.sqlite import DEFAULT_BUSY_TIMEOUT, DEFAULT_SLOT_TTL, SqliteStore

STORE_FILE_NAME = "llmgw.sqlite3"


def store_url_for_state(state_dir: str | Path) -> str:
    """The store of a state directory (`llmgw up`'s `.state/`): `<state_dir>/llmgw.sqlite3`."""
    return str(Path(state_dir) / STORE_FILE_NAME)


def open_store(url: str | Path, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
               slot_ttl: float = DEFAULT_SLOT_TTL) -> Store:
    """Open (creating if missing, migrating if older) the store at `url`.

    `url` is a filesystem path (relative or absolute) or `sqlite:///ABSOLUTE/PATH` (`sqlite:////...` is
    accepted too): a SQLite file in WAL mode. `postgresql://` is not supported yet. `busy_timeout` and
    `slot_ttl` are seconds (see SqliteStore).
    Raises StoreError for an unsupported URL or a file that cannot be used.
    """
    text = str(url)
    if "://" not in text:
        if not text or text == ":memory:":
            raise StoreError(f"{text!r} is not a store path; give a file path such as .state/{STORE_FILE_NAME}.")
        return SqliteStore(Path(text).expanduser(), busy_timeout=busy_timeout, slot_ttl=slot_ttl)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        if parts.netloc or not parts.path or parts.path == "/":
            raise StoreError(f"The store URL {text!r} has no file path; write sqlite:///absolute/path/{STORE_FILE_NAME}.")
        return SqliteStore(Path(parts.path), busy_timeout=busy_timeout, slot_ttl=slot_ttl)
    if scheme in ("postgresql", "postgres") or scheme.startswith("postgresql+"):
        raise StoreError("A PostgreSQL store is not yet supported; use SQLite (a path or sqlite:///path) for now.")
    raise StoreError(f"Unknown store URL scheme {parts.scheme!r} in {text!r}; use a path or sqlite:///path.")

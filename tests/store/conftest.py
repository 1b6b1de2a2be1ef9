"""Fixtures of the store tests: a real SQLite store file in a temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.store import SqliteStore, open_store


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "llmgw.sqlite3"


@pytest.fixture
def store(store_path: Path) -> Iterator[SqliteStore]:
    opened = open_store(store_path)
    assert isinstance(opened, SqliteStore)
    yield opened
    opened.close()

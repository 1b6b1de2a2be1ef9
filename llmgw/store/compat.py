"""Expand in this release, contract in the next: the rule that keeps a store usable by the release before.

During an upgrade a control plane of the new release migrates the store while one of the previous release (the
leader, upgraded last) still reads and writes it. So a migration of a release only expands: it adds tables,
columns that may be NULL or have a default, and indexes; it drops, renames and retypes nothing, and adds no
constraint the previous release's writes could break (`contract_steps` finds what would). What the new release
stops using is dropped by a migration of a later release, a contract: listed in `SQLITE_CONTRACTS` /
`POSTGRES_CONTRACTS` with the oldest schema whose code no longer needs what it removes (so the release before it,
which shipped that schema, keeps working).

A store records that oldest schema (`readable_from`) in `READABLE_TABLE` (one row, written each time it is opened
to migrate; beside `schema_migrations`, not one of the tables `llmgw store copy` copies);
llmgw opens a store whose schema is newer than its own when that record says its code may still use it (without
migrating anything), and refuses it otherwise, naming both versions. Checked: tests/store/test_expand_only.py lints
every migration and runs the previous release's code (tests/support/previous_release.py) on a store migrated by
this tree, on both backends. docs/store.md "Migrations" says how to write a contract.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

READABLE_TABLE = "schema_readable"
"""The table whose one row (`readable_from`) is the oldest schema version (of the store's backend) whose llmgw may
use the store."""

SQLITE_CONTRACTS: Mapping[int, int] = {
    2: 2,  # quota_reservations rebuilt WITHOUT ROWID (DROP and RENAME): made before this rule, readable from 2 on
    5: 5,  # admin_tokens dropped for tokens: made before this rule, readable from 5 on
}
"""SQLite migrations that drop, rename or retype: migration number -> the oldest schema whose code still works."""

POSTGRES_CONTRACTS: Mapping[int, int] = {
    3: 3,  # admin_tokens dropped for tokens (SQLite's 5): made before this rule, readable from 3 on
}
"""PostgreSQL's, as `SQLITE_CONTRACTS`."""

_CONTRACT_PATTERNS = (
    (re.compile(r"\bDROP\s+(TABLE|COLUMN|INDEX|VIEW|TRIGGER|CONSTRAINT|DEFAULT)\b", re.I), "drops a {0}"),
    (re.compile(r"\bRENAME\b", re.I), "renames"),
    (re.compile(r"\bALTER\s+COLUMN\s+\w+\s+(SET\s+DATA\s+)?TYPE\b", re.I), "changes a column's type"),
    (re.compile(r"\bSET\s+NOT\s+NULL\b", re.I), "makes a column NOT NULL"),
    (re.compile(r"\bADD\s+(CONSTRAINT|CHECK|UNIQUE|PRIMARY|FOREIGN)\b", re.I), "adds a constraint"),
    (re.compile(r"\b(TRUNCATE|DELETE\s+FROM)\b", re.I), "deletes rows"),
)


def contract_steps(sql: str) -> list[str]:
    """What in migration `sql` the previous release's code could trip on, one sentence per statement: dropping,
    renaming or retyping anything, a new NOT NULL column without a DEFAULT (the previous release's INSERTs do not
    name it), NOT NULL or a constraint added to a column, rows deleted. Empty for a migration that only expands.
    Pure; a lint of the SQL text (comments stripped), statement by statement."""
    found: list[str] = []
    text = re.sub(r"--[^\n]*", "", sql)
    for statement in (s.strip() for s in text.split(";")):
        if not statement:
            continue
        short = " ".join(statement.split())[:100]
        for pattern, what in _CONTRACT_PATTERNS:
            match = pattern.search(statement)
            if match:
                found.append(f"{what.format(*(g.lower() for g in match.groups() if g))}: {short}")
        for column in re.finditer(r"\bADD\s+COLUMN\s+([^,]*)", statement, re.I):
            spec = column.group(1)
            if re.search(r"\bNOT\s+NULL\b", spec, re.I) and not re.search(r"\bDEFAULT\b", spec, re.I):
                found.append(f"adds a NOT NULL column without a DEFAULT: {short}")
    return found


def readable_from(version: int, contracts: Mapping[int, int]) -> int:
    """The oldest schema version whose code may use a store at schema `version`: the most any contract up to it
    asks (`contracts`: migration number -> oldest schema), 1 when none does. Pure."""
    return max((oldest for number, oldest in contracts.items() if number <= version), default=1)


def newer_store_refusal(where: str, current: int, readable: int | None, known: int, backend: str) -> str | None:
    """Why llmgw of `backend` schema `known` may not use the store `where` at schema `current` (> `known`) whose
    record says it is readable from schema `readable` (None: no record, a store migrated before this rule): a
    sentence naming both versions and what to do; None when it may (`readable` <= `known`). Pure."""
    if readable is not None and readable <= known:
        return None
    needs = f"; it needs llmgw of {backend} schema {readable} or newer" if readable is not None else ""
    return (f"The store {where} has schema version {current}, newer than this llmgw knows ({backend} schema "
            f"{known}){needs}; upgrade llmgw or point it at another store.")

"""A PostgreSQL store's schema dumped with `pg_dump` (custom format) and loaded back, possibly into another schema
or database, with `pg_restore` and `psql`.

`pg_restore` cannot rename a schema, so a load asks it for the SQL script (`pg_restore -f -`), renames the schema
in the script's statements (never inside the rows of a `COPY ... FROM stdin` block: `rename_schema`, pure) and runs
that with `psql --single-transaction -v ON_ERROR_STOP=1`: the schema is loaded whole or not at all. The password of
a URL travels in `PGPASSWORD`, never on a command line.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

from llmgw.errors import BackupError

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def schema_of(url: str) -> str:
    """The schema a store URL works in: the `search_path` of its libpq `options` (`-csearch_path=NAME`), else
    "public". Pure. Raises BackupError when it is not a plain lower-case identifier (the only kind renamed)."""
    options = " ".join(parse_qs(urlsplit(url).query).get("options", []))
    match = re.search(r"(?:-c\s*|--)search_path=([^\s,]+)", options)
    schema = match.group(1) if match else "public"
    if not _IDENTIFIER.match(schema):
        raise BackupError(f"the store's schema {schema!r} is not a plain lower-case name; llmgw backs up and restores "
                          "schemas named like llmgw or llmgw_prod.")
    return schema


def _libpq(url: str) -> tuple[str, dict[str, str]]:
    """(the URL without its password, the environment carrying it)."""
    parts = urlsplit(url)
    env = dict(os.environ)
    if parts.password is not None:
        from urllib.parse import unquote

        env["PGPASSWORD"] = unquote(parts.password)
        host = parts.netloc.rpartition("@")[2]
        user = parts.username or ""
        url = urlunsplit((parts.scheme, f"{user}@{host}" if user else host, parts.path, parts.query, parts.fragment))
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    return url, env


def _run(argv: list[str], env: dict[str, str], what: str, stdin: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, env=env, check=False)
    except FileNotFoundError as exc:
        raise BackupError(f"{argv[0]} is not installed; install the PostgreSQL client tools (Debian: "
                          f"postgresql-client) of the server's major version to {what}.") from exc
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise BackupError(f"{argv[0]} failed to {what} (exit {done.returncode}): {' / '.join(tail)}")
    return done.stdout


def dump_schema(url: str, out: Path) -> str:
    """`pg_dump --format=custom` of the store's schema (`schema_of(url)`) into `out`. Returns the schema. Blocking.
    Raises BackupError with pg_dump's own words when it fails."""
    schema = schema_of(url)
    plain, env = _libpq(url)
    _run(["pg_dump", "--format=custom", "--no-owner", "--no-privileges", f"--schema={schema}", "--file", str(out),
          "--dbname", plain], env, f"dump the schema {schema} of the store")
    return schema


def rename_schema(script: str, old: str, new: str) -> str:
    """`script` (SQL from `pg_restore -f -`) with the schema `old` renamed `new` in every statement, and its
    `CREATE SCHEMA` made `IF NOT EXISTS`; the rows of `COPY ... FROM stdin;` blocks (up to their `\\.` line) are
    kept byte for byte. Pure."""
    word = re.compile(rf"\b{re.escape(old)}\b")
    lines, out, in_copy = script.split("\n"), [], False
    for line in lines:
        if in_copy:
            out.append(line)
            in_copy = line != "\\."
            continue
        if old != new:
            line = word.sub(new, line)
        if line.startswith("CREATE SCHEMA ") and "IF NOT EXISTS" not in line:
            line = line.replace("CREATE SCHEMA ", "CREATE SCHEMA IF NOT EXISTS ", 1)
        in_copy = line.startswith("COPY ") and line.rstrip().endswith("FROM stdin;")
        out.append(line)
    return "\n".join(out)


def tables_in(url: str, schema: str) -> list[str]:
    """The tables of `schema` in the database of `url` ([] when the schema does not exist). Blocking."""
    plain, env = _libpq(url)
    text = _run(["psql", "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-d", plain, "-c",
                 f"SELECT tablename FROM pg_tables WHERE schemaname = '{schema}' ORDER BY 1"], env,
                "list the tables of the target schema").decode()
    return [line for line in text.splitlines() if line]


def load_schema(dump: Path, old: str, url: str) -> str:
    """Load the dump `dump` (of schema `old`) into the schema of `url` (`schema_of`), in one transaction. Returns
    that schema. Blocking. Raises BackupError when the target schema holds tables already (nothing is loaded) or
    pg_restore/psql fail (nothing is loaded: one transaction)."""
    new = schema_of(url)
    present = tables_in(url, new)
    if present:
        raise BackupError(f"the schema {new} of {urlsplit(url).hostname}/{urlsplit(url).path.lstrip('/')} holds "
                          f"tables already ({', '.join(present[:4])}{' ...' if len(present) > 4 else ''}); restore "
                          "into a new, empty schema or database (--store URL with options=-csearch_path=NAME).")
    plain, env = _libpq(url)
    script = _run(["pg_restore", "--no-owner", "--no-privileges", "--file", "-", str(dump)], env,
                  "read the store's dump").decode()
    _run(["psql", "-X", "-q", "--single-transaction", "-v", "ON_ERROR_STOP=1", "-d", plain, "-f", "-"], env,
         f"load the store into the schema {new}", stdin=rename_schema(script, old, new).encode())
    return new

"""`llmgw backup`: one archive of what a control plane cannot rebuild (`manifest` says the layout).

- the store: SQLite copied online with sqlite3's backup API (a consistent copy while the control plane writes it,
  never a copy of the file), PostgreSQL dumped with `pg_dump` (`postgres_dump`);
- the CA (`ca/ca.key`, `ca/ca.crt`, the record of issued and revoked certificates, outstanding join tokens' hashes);
- the admin token file and the secrets directory (admin and other tokens' hashes are in the store);
- the settings repository's refs (the settings branches, `refs/llmgw/audit` and `refs/llmgw/applied`) as a git
  bundle made by the `git` CLI.

The archive is written to a temporary file of mode 0600 beside `out`, then renamed: it holds the CA's private key
and the secrets, so whoever reads it can issue node certificates.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from llmgw import __version__
from llmgw.backup.manifest import (
    ADMIN_TOKEN_MEMBER, BUNDLE_MEMBER, MANIFEST_NAME, PGDUMP_MEMBER, SQLITE_MEMBER, Manifest, Member,
)
from llmgw.backup.postgres_dump import dump_schema
from llmgw.errors import BackupError

CA_FILES = ("ca.key", "ca.crt", "ca.next.key", "ca.next.crt", "nodes.json", "join-tokens.json")
"""The CA's files (the new CA's beside them while `llmgw ca rotate` is under way), each when present."""
REF_PREFIXES = ("refs/heads/", "refs/llmgw/")


@dataclass(frozen=True)
class BackupSummary:
    """What `write_backup` wrote: the archive's path and its manifest."""

    path: Path
    manifest: Manifest


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def copy_sqlite(source: Path, destination: Path) -> None:
    """A consistent copy of the live SQLite database `source` into the new file `destination`, through sqlite3's
    online backup API: all pages in one step, inside one read transaction (the store runs in WAL mode, so its writers
    are not stopped; a copy in several steps would restart whenever they wrote). Blocking."""
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as exc:
        raise BackupError(f"the store {source} cannot be opened ({exc}).") from exc
    try:
        dst = sqlite3.connect(destination)
        try:
            src.backup(dst)  # every page in one step: one read transaction, never restarted by a writer
        finally:
            dst.close()
    except sqlite3.Error as exc:
        raise BackupError(f"copying the store {source} failed ({exc}); run llmgw backup again.") from exc
    finally:
        src.close()


def bundle_refs(repo: Path, out: Path) -> list[str]:
    """`git bundle create` of the settings repository `repo`'s branches and llmgw refs into `out`. Returns the refs.
    Raises BackupError when git fails or `repo` has none of them. It only reads `repo`, so a repository of another
    user (root backing up `server init`'s, which is the user llmgw's) is read: git's safe.directory for it alone."""
    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", "-c", f"safe.directory={repo.resolve()}", "-C", str(repo), *args],
                                  capture_output=True, text=True, check=False)
        except FileNotFoundError as exc:
            raise BackupError("git is not installed; llmgw backup bundles the settings repository with it.") from exc
        if done.returncode != 0:
            raise BackupError(f"git {args[0]} in {repo} failed: {done.stderr.strip()}")
        return done.stdout

    refs = [line for line in git("for-each-ref", "--format=%(refname)", *REF_PREFIXES).splitlines() if line]
    if not refs:
        raise BackupError(f"{repo} holds no branch: give the settings repository with --repo.")
    git("bundle", "create", "--quiet", str(out), *refs)
    return refs


def _files(directory: Path) -> Iterator[Path]:
    if directory.is_dir():
        yield from sorted(path for path in directory.iterdir() if path.is_file() and not path.name.startswith("."))


def write_backup(state_dir: Path, out: Path, *, store_url: str, repo: Path, branch: str = "main",
                 secrets_dir: Path | None = None, now: datetime.datetime | None = None) -> BackupSummary:
    """Write the archive of the control plane whose state is `state_dir` to `out` (mode 0600; refused when `out`
    exists). Its CA is archived when `<state>/ca` holds one (a control plane that never served TLS has none). `store_url`: its store (a SQLite path or a postgresql:// URL with its password); `repo`: its settings
    repository; `secrets_dir`: its secrets (default `<state>/secrets`). Blocking (seconds for a large store).
    Raises BackupError naming the file or tool at fault; nothing is left at `out` then."""
    if out.exists():
        raise BackupError(f"{out} exists; give a new file name (a backup never overwrites one).")
    if not state_dir.is_dir():
        raise BackupError(f"{state_dir} is not a directory: give the control plane's state directory with --state.")
    ca = state_dir / "ca"  # absent when the control plane never served TLS: the archive then holds no CA
    now = now or datetime.datetime.now(datetime.timezone.utc)
    with tempfile.TemporaryDirectory(prefix=".llmgw-backup-", dir=out.parent) as scratch_name:
        scratch = Path(scratch_name)
        entries: list[tuple[str, Path]] = []
        schema = ""
        if "://" in store_url and not store_url.startswith("sqlite://"):
            dump = scratch / "llmgw.pgdump"
            schema = dump_schema(store_url, dump)
            entries.append((PGDUMP_MEMBER, dump))
        else:
            copy = scratch / "llmgw.sqlite3"
            copy_sqlite(Path(store_url.removeprefix("sqlite://")), copy)
            entries.append((SQLITE_MEMBER, copy))
        files = [(f"ca/{name}", ca / name) for name in CA_FILES if (ca / name).is_file()]
        if (state_dir / "admin-token").is_file():
            files.append((ADMIN_TOKEN_MEMBER, state_dir / "admin-token"))
        files += [(f"secrets/{path.name}", path) for path in _files(secrets_dir or state_dir / "secrets")]
        for name, path in files:  # copied first, so that the digest and the archived bytes are of one version
            copy = scratch / name.replace("/", "__")
            shutil.copyfile(path, copy)
            entries.append((name, copy))
        bundle = scratch / "settings.bundle"
        bundle_refs(repo, bundle)
        entries.append((BUNDLE_MEMBER, bundle))
        members = tuple(Member(name, sha256_file(path), path.stat().st_size) for name, path in entries)
        manifest = Manifest(llmgw_version=__version__, created=now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                            store_kind="postgresql" if schema else "sqlite", schema=schema, branch=branch,
                            members=members)
        manifest_path = scratch / MANIFEST_NAME
        manifest_path.write_text(manifest.to_json())
        partial = out.with_name(f".{out.name}.partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
                for name, path in [(MANIFEST_NAME, manifest_path), *entries]:
                    info = tar.gettarinfo(str(path), arcname=name)
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    info.mode = 0o600
                    with open(path, "rb") as handle:
                        tar.addfile(info, handle)
            os.replace(partial, out)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    return BackupSummary(out, manifest)

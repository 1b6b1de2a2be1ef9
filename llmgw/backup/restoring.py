"""`llmgw restore`: a control plane's state directory brought back from an archive of `llmgw backup`.

The archive is read twice: first every member's SHA-256 is checked against the manifest (a damaged, missing or
extra member is refused by name, before anything is written), then the members are written under the new state
directory, which must be empty or absent:

    <state>/llmgw.sqlite3       the store (SQLite archives); a PostgreSQL dump is loaded into --store's schema
    <state>/store.json          which store that is (`llmgw.store.StoreRecord`), for `llmgw keys` and the others
    <state>/ca/                 the CA: key, certificate, issued/revoked record, join tokens' hashes
    <state>/admin-token         <state>/secrets/
    <state>/settings.git        a bare repository holding the bundle's refs (settings branch, audit, applied),
                                with llmgw's hooks

A restore that fails removes what it wrote. Agents that joined the old control plane keep their certificates: the
restored CA signs the new control plane's server certificate, so they reconnect to it without joining again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from llmgw.backup.manifest import (
    BUNDLE_MEMBER, MANIFEST_NAME, PGDUMP_MEMBER, SQLITE_MEMBER, Manifest, check_member_name, damaged_members,
    parse_manifest,
)
from llmgw.backup.postgres_dump import load_schema
from llmgw.errors import BackupError
from llmgw.settings import install_hooks
from llmgw.store import STORE_FILE_NAME, store_record, write_store_record


@dataclass(frozen=True)
class RestoreSummary:
    """What `restore_backup` did: the manifest read, the state directory, the settings repository and the store."""

    manifest: Manifest
    state_dir: Path
    repo: Path
    store: str


@contextmanager
def _reading(archive: Path) -> Iterator[tarfile.TarFile]:
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            yield tar
    except FileNotFoundError as exc:
        raise BackupError(f"{archive} does not exist.") from exc
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise BackupError(f"{archive} is damaged or truncated ({exc}); nothing was restored: use another copy.") from exc


def verify_archive(archive: Path) -> Manifest:
    """Read `archive` whole and check every member against its manifest. Returns the manifest. Blocking.
    Raises BackupError naming each damaged, missing or unexpected member, or saying the archive does not read."""
    manifest: Manifest | None = None
    found: dict[str, str] = {}
    with _reading(archive) as tar:
        for info in tar:
            if not info.isfile():
                raise BackupError(f"{archive} holds {info.name!r}, which is not a file: not an llmgw backup.")
            handle = tar.extractfile(info)
            assert handle is not None  # a regular file always has one
            if info.name == MANIFEST_NAME:
                manifest = parse_manifest(handle.read())
                continue
            digest = hashlib.sha256()
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
            found[info.name] = digest.hexdigest()
    if manifest is None:
        raise BackupError(f"{archive} has no {MANIFEST_NAME}: it is not an llmgw backup.")
    problems = damaged_members(manifest, found)
    if problems:
        raise BackupError(f"{archive} is damaged, nothing was restored: {'; '.join(problems)}. Use another copy.")
    return manifest


def _write(path: Path, source, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(source, out)


def _git(*args: str) -> None:
    done = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BackupError(f"git {args[0]} failed while restoring the settings repository: {done.stderr.strip()}")


def _restore_repo(bundle: Path, repo: Path, branch: str) -> None:
    _git("init", "--quiet", "--bare", str(repo))
    _git("-C", str(repo), "bundle", "verify", "--quiet", str(bundle))  # git verifies a bundle inside a repository
    _git("-C", str(repo), "fetch", "--quiet", str(bundle), "refs/*:refs/*")
    _git("-C", str(repo), "symbolic-ref", "HEAD", f"refs/heads/{branch}")
    _git("-C", str(repo), "config", "llmgw.branch", branch)
    install_hooks(repo)


def restore_backup(archive: Path, state_dir: Path, *, store_url: str | None = None) -> RestoreSummary:
    """Restore `archive` into the new state directory `state_dir` (see the module). `store_url`: for an archive of a
    PostgreSQL store, the postgresql:// URL whose schema (empty or absent) receives it; must be None for a SQLite
    archive. Blocking. Raises BackupError (damaged archive, non-empty target, wrong or missing --store, a tool that
    failed); what was written is removed then."""
    if state_dir.exists() and (not state_dir.is_dir() or any(state_dir.iterdir())):
        raise BackupError(f"{state_dir} is not empty; restore into a new or empty directory (a restore never "
                          "mixes with an existing control plane's state).")
    manifest = verify_archive(archive)
    if manifest.store_kind == "postgresql" and not store_url:
        raise BackupError(f"{archive} holds a PostgreSQL store (schema {manifest.schema}); give --store "
                          "postgresql://... naming the database and an empty schema to restore it into.")
    if manifest.store_kind == "sqlite" and store_url:
        raise BackupError(f"{archive} holds a SQLite store; restore it without --store (it becomes "
                          f"{state_dir / STORE_FILE_NAME}), then move it with `llmgw store copy` if you wish.")
    created = not state_dir.exists()
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    repo = state_dir / "settings.git"
    try:
        with tempfile.TemporaryDirectory(prefix=".llmgw-restore-", dir=state_dir) as scratch_name:
            scratch = Path(scratch_name)
            with _reading(archive) as tar:
                for info in tar:
                    handle = tar.extractfile(info)
                    if info.name == MANIFEST_NAME or handle is None:
                        continue
                    check_member_name(info.name)  # checked in the first pass too: the file may have changed since
                    if info.name == SQLITE_MEMBER:
                        _write(state_dir / STORE_FILE_NAME, handle)
                    elif info.name in (PGDUMP_MEMBER, BUNDLE_MEMBER):
                        _write(scratch / info.name.replace("/", "__"), handle)
                    else:
                        _write(state_dir / info.name, handle)
            _restore_repo(scratch / BUNDLE_MEMBER, repo, manifest.branch)
            if manifest.store_kind == "postgresql":
                assert store_url is not None
                load_schema(scratch / PGDUMP_MEMBER.replace("/", "__"), manifest.schema, store_url)
                record = store_record(None, state_dir, override_url=store_url)
            else:
                record = store_record(None, state_dir)
            write_store_record(state_dir, record)
    except BaseException:
        if created:
            shutil.rmtree(state_dir, ignore_errors=True)
        else:
            for child in state_dir.iterdir():
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        raise
    return RestoreSummary(manifest, state_dir, repo, record.url)

"""The install journal: everything llmgw created on a host, recorded before it is done, so it can be undone.

    journal = Journal.open()                                     # /var/lib/llmgw-install/journal.json
    journal.make_dirs(Path("/opt/llmgw/0.9.0"))                  # each directory that did not exist
    journal.write_file(Path("/etc/llmgw/agent.yaml"), data, mode=0o600)
    journal.make_dirs(Path("/var/lib/llmgw/weights"), weights=True)   # kept by `llmgw wipe --keep-weights`
    journal.symlink(Path("/opt/llmgw/current"), "0.9.0")
    journal.record(InstalledUnit("llmgw-agent.service", enabled=True, started=True))  # done by the caller
    # ... later, `llmgw wipe`: llmgw.install.undoing.undo(journal)

Entries are frozen values, one class per kind (`CreatedDirectory`, `WrittenFile`, `CreatedLink`, `InstalledUnit`,
`CreatedUser`, `FirewallTable`). A path llmgw did not create is never recorded as created: `make_dirs` records
only the directories it makes, and `write_file` over an existing file first keeps a copy of it beside the journal
(`backups/<sha256>`) and records that digest, so undoing restores the file instead of deleting it.

Crash safety: each entry is recorded before its action (intent first), and every record rewrites the whole
journal atomically (a temporary file, fsync, rename, fsync of the directory). A crash at any point leaves a
journal that lists everything done so far, and perhaps one entry not done, which undoing finds absent and skips.
(The one exception: the journal's own missing directories are made just before its first save.) Writing a file
or link again replaces its entry, so the journal lists each path once.

Format: one JSON document, `{"format": 1, "entries": [{"kind": "directory", "path": ...}, ...]}`, in creation
order. Pure data and file I/O only (no processes): undoing units, users and tables is llmgw.install.undoing's.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from llmgw.errors import InstallError

JOURNAL_PATH = Path("/var/lib/llmgw-install/journal.json")
"""Where a host's journal lives unless told otherwise (`llmgw wipe --journal`): a directory of root's own (0700),
not /var/lib/llmgw, which the control plane's unit gives to its unprivileged user (a journal it could write would
let it make a root `llmgw wipe` remove any path)."""

FORMAT = 1


@dataclass(frozen=True)
class CreatedDirectory:
    """A directory llmgw made (it did not exist); undone by removing it with all it holds. `weights`: it holds
    model weights (kept by `llmgw wipe --keep-weights`, with the directories above it)."""

    path: str
    weights: bool = False
    kind = "directory"


@dataclass(frozen=True)
class WrittenFile:
    """A file llmgw wrote with content `sha256` and permission bits `mode`. `replaced`: the sha256 of the file that
    was there before (its copy is `backups/<replaced>` beside the journal), or "" when there was none;
    `replaced_mode` its permission bits (its owner is kept: the file is replaced, not removed)."""

    path: str
    sha256: str
    mode: int
    replaced: str = ""
    replaced_mode: int = 0
    kind = "file"


@dataclass(frozen=True)
class CreatedLink:
    """A symbolic link llmgw made at `path` pointing at `target` (e.g. /opt/llmgw/current)."""

    path: str
    target: str
    kind = "link"


@dataclass(frozen=True)
class InstalledUnit:
    """A systemd unit llmgw enabled and/or started (its file is a `WrittenFile` of its own)."""

    name: str
    enabled: bool = False
    started: bool = False
    kind = "unit"


@dataclass(frozen=True)
class CreatedUser:
    """A Linux user (and its group of the same name) llmgw created, e.g. for Slurm or the agent. `files`: the
    files useradd and userdel rewrite besides the user's own lines (/etc/passwd- and the like), each with the
    sha256 it had before (its copy in `backups/`), or "" when it was absent (llmgw.install.users)."""

    name: str
    files: tuple[tuple[str, str], ...] = ()
    kind = "user"


@dataclass(frozen=True)
class FirewallTable:
    """An nftables table llmgw created (`nft add table <family> <name>`)."""

    family: str
    name: str
    kind = "firewall-table"


Entry = CreatedDirectory | WrittenFile | CreatedLink | InstalledUnit | CreatedUser | FirewallTable
_KINDS: dict[str, type] = {cls.kind: cls for cls in
                           (CreatedDirectory, WrittenFile, CreatedLink, InstalledUnit, CreatedUser, FirewallTable)}


def describe(entry: Entry) -> str:
    """One line for a person: "directory /opt/llmgw/0.9.0", "unit llmgw-agent.service", ..."""
    if isinstance(entry, InstalledUnit):
        return f"unit {entry.name}"
    if isinstance(entry, CreatedUser):
        return f"user {entry.name}"
    if isinstance(entry, FirewallTable):
        return f"firewall table {entry.family} {entry.name}"
    if isinstance(entry, CreatedLink):
        return f"link {entry.path} -> {entry.target}"
    if isinstance(entry, WrittenFile) and entry.replaced:
        return f"file {entry.path} (replaced one that is restored)"
    return f"{entry.kind} {entry.path}" + (" (weights)" if getattr(entry, "weights", False) else "")


def _frozen(value):
    """JSON lists as tuples (of tuples), as the entries hold them."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def sha256_of(path: Path) -> str:
    """The sha256 of the file at `path`, hex. Raises OSError when it cannot be read."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes, mode: int) -> None:
    """Replace `path` with `data` (permission bits `mode`; the owner and group of a file replaced are kept) so a
    reader sees the old or the new file, never half: a temporary file beside it, fsync, rename, fsync of the
    directory. Raises OSError."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if path.is_file():
                old = path.stat()
                os.fchown(handle.fileno(), old.st_uid, old.st_gid)
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


class Journal:
    """The journal at `path` and its entries in creation order (module docstring). Not safe for two writers."""

    def __init__(self, path: Path, entries: tuple[Entry, ...] = ()):
        self.path = path
        self.entries: tuple[Entry, ...] = entries

    @classmethod
    def open(cls, path: Path = JOURNAL_PATH) -> Journal:
        """The journal at `path`, read if it exists, else a new one whose own missing directories are made and
        recorded as its first entries. Raises InstallError naming the file when it cannot be read or made."""
        if path.exists():
            return cls.read(path)
        journal = cls(path)
        missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()][::-1]
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # a crash before the save leaves these empty
        except OSError as exc:
            raise InstallError(f"{path.parent}: cannot make the install journal's directory ({exc})") from exc
        journal._save(tuple(CreatedDirectory(str(directory)) for directory in missing))
        return journal

    @classmethod
    def read(cls, path: Path = JOURNAL_PATH) -> Journal:
        """The journal at `path`. Raises InstallError naming the file (and the entry) when it is absent or not a
        journal of this format."""
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise InstallError(f"{path}: no install journal here: llmgw installed nothing on this machine "
                               "(or it was wiped already)") from None
        except (OSError, ValueError) as exc:
            raise InstallError(f"{path}: not a readable install journal ({exc}); nothing was changed") from exc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), list):
            raise InstallError(f"{path}: not an install journal of format {FORMAT}; nothing was changed")
        entries = []
        for number, raw in enumerate(doc["entries"], 1):
            try:
                entry_type = _KINDS[raw["kind"]]
                entries.append(entry_type(**{f.name: _frozen(raw[f.name]) for f in fields(entry_type) if f.name in raw}))
            except (KeyError, TypeError) as exc:
                raise InstallError(f"{path}: entry {number} is not one llmgw writes ({raw!r}); nothing was "
                                   "changed") from exc
        return cls(path, tuple(entries))

    @property
    def backups(self) -> Path:
        """The directory of copies of files llmgw replaced, beside the journal."""
        return self.path.parent / "backups"

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def _save(self, entries: tuple[Entry, ...]) -> None:
        doc = {"format": FORMAT, "entries": [{"kind": e.kind, **asdict(e)} for e in entries]}
        try:
            write_atomically(self.path, (json.dumps(doc, indent=1) + "\n").encode(), 0o600)
        except OSError as exc:
            raise InstallError(f"{self.path}: cannot write the install journal ({exc})") from exc
        self.entries = entries

    def record(self, entry: Entry, *, replacing: Entry | None = None) -> None:
        """Add `entry` (about to be done, or done by the caller), instead of `replacing` when given, and save the
        journal atomically. Raises InstallError when the journal cannot be written: then do not go on."""
        self._save((*(e for e in self.entries if e != replacing), entry))

    def forget(self, entry: Entry) -> None:
        """Remove `entry` (undone) and save; when nothing is left, delete the journal file itself."""
        rest = tuple(e for e in self.entries if e != entry)
        if rest:
            self._save(rest)
            return
        self.path.unlink(missing_ok=True)
        self.entries = ()

    def _entry_at(self, kind: type, path: Path) -> Entry | None:
        return next((e for e in self.entries if isinstance(e, kind) and e.path == str(path)), None)

    def make_dirs(self, path: Path, *, mode: int = 0o755, weights: bool = False) -> None:
        """Make `path` and its missing parents, recording each one made (top first; `weights` marks `path`)."""
        missing = [p for p in (path, *path.parents) if not p.exists()][::-1]
        for directory in missing:
            self.record(CreatedDirectory(str(directory), weights=weights and directory == path))
            directory.mkdir(mode=mode)

    def write_file(self, path: Path, data: bytes, *, mode: int = 0o644) -> None:
        """Write `data` to `path` atomically (its directory made and recorded if missing); a file that was there
        is copied to `backups/` first and restored by undoing."""
        self.make_dirs(path.parent)
        previous = self._entry_at(WrittenFile, path)
        if previous:
            replaced, replaced_mode = previous.replaced, previous.replaced_mode
        else:
            replaced = self.keep_copy(path)
            replaced_mode = path.stat().st_mode & 0o7777 if replaced else 0
        entry = WrittenFile(str(path), hashlib.sha256(data).hexdigest(), mode, replaced, replaced_mode)
        self.record(entry, replacing=previous)
        write_atomically(path, data, mode)

    def keep_copy(self, path: Path) -> str:
        """Copy the file at `path` to `backups/<sha256>` (once per content) and return that sha256; "" when there
        is no file at `path`. Raises OSError when it cannot be read or copied."""
        if not path.is_file():
            return ""
        digest = sha256_of(path)
        self.make_dirs(self.backups, mode=0o700)
        if not (self.backups / digest).exists():
            write_atomically(self.backups / digest, path.read_bytes(), 0o600)
        return digest

    def symlink(self, path: Path, target: str) -> None:
        """Point the link `path` at `target`, replacing a link llmgw made there before (atomically: a new link
        renamed over it). Raises InstallError when something else is at `path`."""
        self.make_dirs(path.parent)
        previous = self._entry_at(CreatedLink, path)
        if (path.is_symlink() or path.exists()) and previous is None:
            raise InstallError(f"{path} exists and llmgw did not make it: move it away, then try again")
        self.record(CreatedLink(str(path), target), replacing=previous)
        temporary = path.with_name(f".{path.name}.new")
        temporary.unlink(missing_ok=True)
        os.symlink(target, temporary)
        os.replace(temporary, path)


def record_on_installed_host(entry: Entry, path: Path = JOURNAL_PATH) -> bool:
    """Add `entry` to the journal at `path` when llmgw installed this host (the journal exists) and it is not
    listed yet; return whether the journal now lists it (False: no journal here, nothing recorded). For what a
    running program creates after the install, e.g. the agent's nftables table (issue 29), so `llmgw wipe`
    undoes it too. Holds an exclusive `flock` on the journal's directory while it reads and writes, so two such
    programs do not lose each other's entries. Raises InstallError when the journal cannot be read or written."""
    if not path.exists():
        return False
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        journal = Journal.read(path)
        if entry not in journal.entries:
            journal.record(entry)
        return True
    finally:
        os.close(fd)  # closing the descriptor ends the lock

"""Undoing what an install journal lists (`llmgw wipe`, and a `node add` that fails halfway).

    for entry, size in sizes(journal): ...                 # what would go, with bytes on disk now
    outcomes = undo(journal, keep_weights=True)            # newest entry first; the journal shrinks as it goes

Entries are undone newest first, each forgotten from the journal as soon as it is undone, so an interrupted undo
leaves a journal of what is still there and can simply be run again. What each kind becomes:

- a unit: `systemctl disable --now` where systemd is PID 1 (/run/systemd/system exists), nothing to do elsewhere;
  the `spare_unit` (an agent wiping its own host runs in it) only `systemctl disable`: it stops itself after;
- a firewall table: `nft delete table FAMILY NAME` (absent already: nothing to do);
- a user: `userdel NAME` (absent already: nothing to do), then its side files as they were (llmgw.install.users);
- a link: removed when it still points where llmgw pointed it;
- a file: removed when its content is still what llmgw wrote; restored from `backups/` when llmgw replaced one;
  changed since (someone edited it) and outside any directory llmgw made: kept, and named in the outcome;
- a directory: removed with everything in it. With `keep_weights`, a weights directory stays, and so do the
  directories above it and the journal, which still lists them for a later wipe.

Undoing runs `systemctl`, `nft` and `userdel` (llmgw.install.commands) and removes files.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from llmgw.errors import InstallError
from llmgw.install.commands import Runner, check_command, run_command
from llmgw.install.journal import (
    CreatedDirectory,
    CreatedLink,
    CreatedUser,
    Entry,
    FirewallTable,
    InstalledUnit,
    Journal,
    WrittenFile,
    describe,
    sha256_of,
    write_atomically,
)
from llmgw.install.users import remove_user

@dataclass(frozen=True)
class Outcome:
    """What undoing did with one entry: `action` is "removed", "restored", "stopped", "absent" (nothing was
    there any more), "disabled" (the spared unit), "kept" (weights, or what holds them) or "changed" (edited since llmgw wrote it: kept)."""

    entry: Entry
    action: str


def size_of(entry: Entry) -> int:
    """Bytes on disk now of a file or directory entry (a directory: every file below it, links not followed);
    0 for other kinds and for what is absent."""
    if not isinstance(entry, CreatedDirectory | WrittenFile):
        return 0
    path = Path(entry.path)
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size if path.is_file() and not path.is_symlink() else 0
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                continue  # gone meanwhile
    return total


def sizes(journal: Journal) -> list[tuple[Entry, int]]:
    """Each entry, newest first (the order of undoing), with `size_of` it."""
    return [(entry, size_of(entry)) for entry in reversed(journal.entries)]


def kept_paths(journal: Journal, keep_weights: bool) -> set[Path]:
    """The paths undoing leaves in place: with `keep_weights`, each weights directory and the journal itself."""
    if not keep_weights:
        return set()
    weights = {Path(e.path) for e in journal if isinstance(e, CreatedDirectory) and e.weights}
    return weights | {journal.path} if weights else set()


def _remove_tree(path: Path, keep: set[Path]) -> bool:
    """Remove `path` and what it holds, except the paths in `keep` (and the directories on the way to them).
    True when `path` itself is gone."""
    if path in keep:
        return False
    if not any(path in k.parents for k in keep):
        shutil.rmtree(path)
        return True
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            _remove_tree(child, keep)
        elif child not in keep:
            child.unlink()
    return False


def _systemd_runs() -> bool:
    return Path("/run/systemd/system").is_dir()


def _undo_one(entry: Entry, journal: Journal, keep: set[Path], run: Runner, spare_unit: str = "") -> str:
    if isinstance(entry, InstalledUnit):
        if not _systemd_runs():
            return "absent"
        if entry.name == spare_unit:
            check_command(run(["systemctl", "disable", entry.name]), f"unit {entry.name}")
            return "disabled"
        check_command(run(["systemctl", "disable", "--now", entry.name]), f"unit {entry.name}")
        return "stopped"
    if isinstance(entry, FirewallTable):
        if run(["nft", "list", "table", entry.family, entry.name]).returncode:
            return "absent"
        check_command(run(["nft", "delete", "table", entry.family, entry.name]), describe(entry))
        return "removed"
    if isinstance(entry, CreatedUser):
        return remove_user(entry, journal, run)
    path = Path(entry.path)
    if isinstance(entry, CreatedLink):
        if not path.is_symlink() or os.readlink(path) != entry.target:
            return "absent"
        path.unlink()
        return "removed"
    if isinstance(entry, WrittenFile):
        if not path.is_file():
            return "absent"
        made = any(isinstance(e, CreatedDirectory) and Path(e.path) in path.parents for e in journal)
        if sha256_of(path) != entry.sha256 and not made:
            keep.add(journal.path)  # the journal stays, to list it
            return "changed"
        if entry.replaced:
            backup = journal.backups / entry.replaced
            write_atomically(path, backup.read_bytes(), entry.replaced_mode)
            return "restored"
        path.unlink()
        return "removed"
    if not path.is_dir():
        return "absent"
    return "removed" if _remove_tree(path, keep) else "kept"


def undo(journal: Journal, *, keep_weights: bool = False, run: Runner = run_command,
         spare_unit: str = "") -> list[Outcome]:
    """Undo every entry of `journal`, newest first (module docstring), forgetting each once undone; return what
    was done with each, in that order. Kept and changed entries stay in the journal. `spare_unit`: the unit of the
    process undoing (disabled, not stopped: "disabled").
    Raises InstallError naming the entry and path when one cannot be undone: the journal then lists what is left."""
    keep = kept_paths(journal, keep_weights)
    outcomes = []
    for entry in reversed(journal.entries):
        try:
            action = _undo_one(entry, journal, keep, run, spare_unit)
        except OSError as exc:
            raise InstallError(f"cannot undo {entry.kind} {getattr(entry, 'path', '')}: {exc}; the journal "
                               f"{journal.path} lists what is left: fix that and run `llmgw wipe` again") from exc
        outcomes.append(Outcome(entry, action))
        if action not in ("kept", "changed"):
            journal.forget(entry)
    return outcomes

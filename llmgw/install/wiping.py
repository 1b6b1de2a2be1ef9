"""A wipe, as words for a person: what `llmgw wipe` prints and what an agent told to wipe its host (WipeNode over
its stream, `llmgw node remove`) answers with. One code path for both.

    lines, total = listing(journal, keep_weights)          # before: every entry with its size, newest first
    outcomes = undo(journal, keep_weights=..., spare_unit=...)   # llmgw.install.undoing
    lines += summary(outcomes, journal)                     # after: what was kept, removed, already gone

`wipe_host(journal_path, keep_weights, spare_unit)` does all three (blocking: run it in a worker thread from async
code) and returns the lines. Raises InstallError (llmgw.install.journal, llmgw.install.undoing) in their words.
"""

from __future__ import annotations

from pathlib import Path

from llmgw.install.journal import JOURNAL_PATH, Journal, describe
from llmgw.install.undoing import Outcome, kept_paths, sizes, undo
from llmgw.units import format_size


def listing(journal: Journal, keep_weights: bool) -> tuple[list[str], int]:
    """(lines, bytes to free): a heading, then each entry of `journal` newest first with the bytes it holds on disk
    and "(kept: --keep-weights)" when `keep_weights` keeps it, then the total."""
    kept = kept_paths(journal, keep_weights)
    listed = sizes(journal)
    lines = [f"{journal.path} lists {len(listed)} things llmgw made on this machine (newest first):"]
    total = 0
    for entry, size in listed:
        keep = Path(getattr(entry, "path", "")) in kept
        total += 0 if keep else size
        lines.append(f"  {format_size(size) if size else '':>9}  {describe(entry)}"
                     f"{'  (kept: --keep-weights)' if keep else ''}")
    lines.append(f"{format_size(total)} to free.")
    return lines, total


def summary(outcomes: list[Outcome], journal: Journal) -> list[str]:
    """What undoing did, for a person: a line per file kept because it changed, then "wiped: N removed or
    restored, M already gone" and what the journal still lists ("no journal left" when nothing)."""
    lines = [f"kept {o.entry.path}: changed since llmgw wrote it (remove it yourself if unwanted)"
             for o in outcomes if o.action == "changed"]
    gone = sum(o.action in ("removed", "restored", "stopped", "disabled") for o in outcomes)
    left = len(journal)
    lines.append(f"wiped: {gone} removed or restored, {sum(o.action == 'absent' for o in outcomes)} already gone"
                 + (f"; {journal.path} still lists {left} (kept)" if left else "; no journal left"))
    return lines


def wipe_host(journal_path: Path = JOURNAL_PATH, *, keep_weights: bool = False, spare_unit: str = "") -> list[str]:
    """Undo the install journal at `journal_path` (`undo`; `spare_unit`: a unit disabled but not stopped, the
    caller's own) and return `listing`'s lines and `summary`'s. Blocking. Raises InstallError when there is no
    journal or an entry cannot be undone (the journal then lists what is left)."""
    journal = Journal.read(journal_path)
    lines, _ = listing(journal, keep_weights)
    outcomes = undo(journal, keep_weights=keep_weights, spare_unit=spare_unit)
    return lines + summary(outcomes, journal)

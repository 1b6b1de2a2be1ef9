"""Commits llmgw writes itself, with pygit2 only: imperative settings changes and the audit trail.

- `append_audit`: one commit on `refs/llmgw/audit` per reconcile pass that changed something, its parent the
  previous audit commit; `read_audit_log` reads them back, newest first.
- `set_ref`: move a ref such as `refs/llmgw/applied` to a commit.
Refs are written by pygit2 directly (`_move`: compare and swap), so the repository's hooks do not run for these
commits. Settings commits made on a person's behalf (`llmgw stop`, node verbs, ...) are written by
`llmgw.settings.edit_commits.commit_edit`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import pygit2

from llmgw.errors import Issue, SettingsError
from llmgw.settings.reading import open_repository, resolve_commit
from llmgw.settings.refs import APPLIED_REF, AUDIT_REF
from llmgw.settings.repository import LLMGW_SIGNATURE, write_tree



@dataclass(frozen=True)
class AuditEntry:
    """One audit commit: `commit` id, `time` (Unix seconds), `author` ("name <email>"), `message`,
    `files` the paths it added, changed or removed compared with its parent, and `settings_author` ("name
    <email>", "" when unknown): who authored the settings commit its (latest) pass worked for (its first
    `Settings-Author:` line, `append_audit`), the person behind what the pass did."""

    commit: str
    time: float
    author: str
    message: str
    files: tuple[str, ...] = ()
    settings_author: str = ""

    def by(self, person: str) -> bool:
        """Whether `person` (a name or e-mail, or a part of one; any case) authored a settings commit one of this
        entry's passes worked for (an entry may hold several passes), or is its author."""
        wanted = person.strip().lower()
        authors = [*_trailers(self.message, SETTINGS_AUTHOR_TRAILER), self.author]
        return bool(wanted) and any(wanted in author.lower() for author in authors)


SETTINGS_COMMIT_TRAILER = "Settings-Commit: "
SETTINGS_AUTHOR_TRAILER = "Settings-Author: "


def _trailers(message: str, name: str) -> list[str]:
    """The values of the lines of `message` starting with `name`, in order."""
    return [line[len(name):].strip() for line in message.splitlines() if line.startswith(name)]


def _with_settings_author(repo: pygit2.Repository, message: str) -> str:
    """`message` with a `Settings-Author: name <email>` line after each `Settings-Commit: <id>` one (an audit commit
    may hold several passes), naming that commit's author; a commit that is unknown, or "none", gets none."""
    lines = message.split("\n")
    out: list[str] = []
    for index, line in enumerate(lines):
        out.append(line)
        if not line.startswith(SETTINGS_COMMIT_TRAILER):
            continue
        following = lines[index + 1] if index + 1 < len(lines) else ""
        commit_id = line[len(SETTINGS_COMMIT_TRAILER):].strip()
        if following.startswith(SETTINGS_AUTHOR_TRAILER) or not commit_id or commit_id == "none":
            continue
        try:
            author = repo.revparse_single(commit_id).peel(pygit2.Commit).author
        except (KeyError, ValueError, pygit2.GitError):
            continue
        out.append(f"{SETTINGS_AUTHOR_TRAILER}{author.name} <{author.email}>")
    return "\n".join(out)


def _head(repo: pygit2.Repository, ref: str) -> pygit2.Commit | None:
    try:
        return repo.references[ref].peel(pygit2.Commit)
    except KeyError:
        return None


def _move(repo: pygit2.Repository, ref: str, new: pygit2.Oid, expected: pygit2.Oid | None, message: str) -> None:
    """Point `ref` at `new` if it still points at `expected` (None: must not exist)."""
    moved = SettingsError([Issue(ref, 0, 0, "", "moved while llmgw was writing a commit; try again")])
    if expected is None:
        try:
            repo.create_reference_direct(ref, new, False, message=message)
        except (pygit2.AlreadyExistsError, ValueError) as exc:
            raise moved from exc
        return
    reference = repo.references.get(ref)
    if reference is None or reference.resolve().target != expected:
        raise moved
    reference.set_target(new, message)


_CONTROL_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F] if chr(c) not in "\n\t"}
"""Control characters other than newline and tab, written as `\\xNN` in audit messages: an agent's error text
can hold any byte, and git refuses a NUL in a reflog message (and cuts a commit message at one)."""


def append_audit(repo_path: str | os.PathLike[str], files: dict[str, bytes | None], message: str,
                 *, author_name: str = LLMGW_SIGNATURE[0], author_email: str = LLMGW_SIGNATURE[1]) -> str:
    """Add a commit on refs/llmgw/audit whose tree is the previous audit tree with `files` laid over it.

    `files` maps "dir/name" to content; a value of None removes that path. The parent is the previous audit
    commit (none for the first). Control characters in `message` other than newline and tab are escaped as
    `\\xNN`; each `Settings-Commit: <id>` line gets a `Settings-Author: name <email>` line after it, naming who
    authored that settings commit. Returns the new commit id. The caller keeps secrets out of `files`.
    """
    repo = open_repository(repo_path)
    parent = _head(repo, AUDIT_REF)
    tree = write_tree(repo, dict(files), parent.tree if parent else None)
    signature = pygit2.Signature(author_name, author_email)
    text = _with_settings_author(repo, message).translate(_CONTROL_ESCAPES)
    text = text if text.endswith("\n") else text + "\n"
    commit = repo.create_commit(None, signature, signature, text, tree, [parent.id] if parent else [])
    _move(repo, AUDIT_REF, commit, parent.id if parent else None, text.splitlines()[0] if text.strip() else "audit")
    return str(commit)


def set_ref(repo_path: str | os.PathLike[str], ref: str, commit_id: str) -> None:
    """Point `ref` (e.g. "refs/llmgw/applied") at commit `commit_id`, creating it if needed.

    Raises: SettingsError when `commit_id` is not a commit of the repository.
    """
    repo = open_repository(repo_path)
    commit = resolve_commit(repo, commit_id)
    repo.create_reference_direct(ref, commit.id, True, message=f"llmgw: {ref} -> {commit.id}")


def read_audit_log(repo_path: str | os.PathLike[str], limit: int = 50, author: str | None = None,
                   scan: int = 10_000) -> list[AuditEntry]:
    """The last `limit` audit commits, newest first (empty when there is no audit ref yet); with `author`, only
    those `AuditEntry.by` that person, looking at the last `scan` audit commits at most."""
    repo = open_repository(repo_path)
    commit = _head(repo, AUDIT_REF)
    entries: list[AuditEntry] = []
    seen = 0
    while commit is not None and len(entries) < limit and seen < scan:
        seen += 1
        parent = commit.parents[0] if commit.parents else None
        entry = AuditEntry(str(commit.id), float(commit.commit_time), f"{commit.author.name} <{commit.author.email}>",
                           commit.message, (), next(iter(_trailers(commit.message, SETTINGS_AUTHOR_TRAILER)), ""))
        if author is None or entry.by(author):
            diff = repo.diff(parent.tree, commit.tree) if parent is not None else commit.tree.diff_to_tree(swap=True)
            paths = {d.delta.new_file.path if d.delta.new_file.path else d.delta.old_file.path for d in diff}
            entries.append(replace(entry, files=tuple(sorted(paths))))
        commit = parent
    return entries


def read_audit_file(repo_path: str | os.PathLike[str], path: str, commit_id: str | None = None) -> bytes | None:
    """The content of `path` in audit commit `commit_id` (default: the latest), or None when absent."""
    repo = open_repository(repo_path)
    commit = resolve_commit(repo, commit_id) if commit_id else _head(repo, AUDIT_REF)
    if commit is None:
        return None
    try:
        return repo[commit.tree[path].id].data
    except KeyError:
        return None

"""Reading the settings repository's history: what changed on the branch since a commit (`llmgw apply --expect`)
and one file along the audit chain (`llmgw diff --at`). Git reads only (pygit2); blocking.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pygit2

from llmgw.errors import Issue, SettingsError
from llmgw.settings.reading import open_repository, resolve_commit
from llmgw.settings.refs import AUDIT_REF


@dataclass(frozen=True)
class BranchCommit:
    """One commit on the branch: `commit` id (40 hex), `subject` (its message's first line), `author`
    ("name <email>") and `files` the paths it added, changed or removed compared with its first parent."""

    commit: str
    subject: str
    author: str
    files: tuple[str, ...]


def _changed_paths(repo: pygit2.Repository, commit: pygit2.Commit) -> tuple[str, ...]:
    if commit.parents:
        diff = repo.diff(commit.parents[0].tree, commit.tree)
    else:
        diff = commit.tree.diff_to_tree(swap=True)
    return tuple(sorted({d.delta.new_file.path or d.delta.old_file.path for d in diff}))


def commits_since(repo_path: str | os.PathLike[str], old: str, new: str) -> tuple[list[BranchCommit], bool]:
    """The commits reachable from `new` and not from `old` (git's `old..new`), newest first, and whether `old` is
    an ancestor of `new` (False: `new` does not contain `old`, e.g. the branch was reset or force-pushed past it;
    the list then holds what `new` has that `old` has not).

    `old` and `new`: anything `git rev-parse` takes. At most 50 commits are listed (the newest).
    Raises: SettingsError when either names no commit.
    """
    repo = open_repository(repo_path)
    before, after = resolve_commit(repo, old), resolve_commit(repo, new)
    walker = repo.walk(after.id, pygit2.enums.SortMode.TOPOLOGICAL)
    walker.hide(before.id)
    found = []
    for commit in walker:
        if len(found) == 50:
            break
        found.append(BranchCommit(str(commit.id), commit.message.split("\n", 1)[0],
                                  f"{commit.author.name} <{commit.author.email}>", _changed_paths(repo, commit)))
    contained = before.id == after.id or repo.descendant_of(after.id, before.id)
    return found, contained


def read_audit_chain(repo_path: str | os.PathLike[str], path: str) -> list[tuple[str, bytes | None]]:
    """(audit commit id, the content of `path` in it or None) for every commit on refs/llmgw/audit, newest first
    (empty when there is no audit yet)."""
    repo = open_repository(repo_path)
    try:
        commit: pygit2.Commit | None = repo.references[AUDIT_REF].peel(pygit2.Commit)
    except KeyError:
        return []
    chain: list[tuple[str, bytes | None]] = []
    while commit is not None:
        try:
            data: bytes | None = repo[commit.tree[path].id].data
        except KeyError:
            data = None
        chain.append((str(commit.id), data))
        commit = commit.parents[0] if commit.parents else None
    return chain


def audit_commit(repo_path: str | os.PathLike[str], rev: str) -> str:
    """The id of audit commit `rev` (a full or abbreviated id, or `refs/llmgw/audit~3`).

    Raises: SettingsError when `rev` names no commit, or one that is not on refs/llmgw/audit.
    """
    repo = open_repository(repo_path)
    commit = resolve_commit(repo, rev)
    try:
        head = repo.references[AUDIT_REF].peel(pygit2.Commit)
    except KeyError:
        head = None
    if head is None or not (head.id == commit.id or repo.descendant_of(head.id, commit.id)):
        raise SettingsError([Issue(rev, 0, 0, "", f"{str(commit.id)[:12]} is not an audit commit (not on "
                                                  f"{AUDIT_REF}); `llmgw history` lists them")])
    return str(commit.id)

"""A revert llmgw proposes: a commit undoing one settings commit, on a branch of its own (never the settings branch).

`propose_revert` is what a failed canary leaves for a person (`llmgw.control.canaries`): the revert of the commit
whose canary missed its SLO, made on top of that commit (so it merges into the settings branch however far the
branch moved since, as `git revert` would), authored by llmgw, with the reason in its message. Merging it (a pull
request, reviewed as any change) is the person's act; llmgw applies nothing from that branch by itself.
"""

from __future__ import annotations

import os

import pygit2

from llmgw.errors import Issue, SettingsError
from llmgw.settings.reading import open_repository, resolve_commit
from llmgw.settings.refs import branch_ref
from llmgw.settings.repository import LLMGW_SIGNATURE


def propose_revert(repo_path: str | os.PathLike[str], commit_id: str, branch: str, reason: str) -> str:
    """Write the revert of `commit_id` (its parent's content for the paths it changed; a merge commit is reverted
    against its first parent) on top of it, to `refs/heads/<branch>`, and return the revert's commit id.

    The message is git's ("Revert "<subject>"", "This reverts commit <id>.") followed by `reason`. A branch that
    exists already and holds a revert of `commit_id` (its tip's parent is `commit_id`) is left as it is and its tip
    returned. Raises SettingsError when `commit_id` names no commit, when the branch exists holding something else,
    or when the revert does not apply cleanly (it cannot: it is made on the commit itself).
    """
    repo = open_repository(repo_path)
    commit = resolve_commit(repo, commit_id)
    ref = branch_ref(branch)
    existing = repo.references.get(ref)
    if existing is not None:
        tip = existing.peel(pygit2.Commit)
        if tip.parent_ids and tip.parent_ids[0] == commit.id:
            return str(tip.id)
        raise SettingsError([Issue(ref, 0, 0, "", f"branch {branch} exists and does not hold a revert of "
                                                  f"{str(commit.id)[:12]}; delete it to have the revert proposed again")])
    index = repo.revert_commit(commit, commit, mainline=1 if len(commit.parent_ids) > 1 else 0)
    if index.conflicts is not None:
        raise SettingsError([Issue(str(commit.id), 0, 0, "", "its revert does not apply cleanly")])
    tree = index.write_tree(repo)
    subject = commit.message.splitlines()[0] if commit.message.strip() else str(commit.id)[:12]
    message = f'Revert "{subject}"\n\nThis reverts commit {commit.id}.\n\n{reason.rstrip()}\n'
    signature = pygit2.Signature(*LLMGW_SIGNATURE)
    revert = repo.create_commit(None, signature, signature, message, tree, [commit.id])
    repo.create_reference_direct(ref, revert, False, message=f"llmgw: proposed revert of {commit.id}")
    return str(revert)

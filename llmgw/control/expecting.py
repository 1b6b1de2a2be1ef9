"""`llmgw apply --expect REV`: apply only what was reviewed. Blocking (git reads): call it in a worker thread.

A review (`llmgw review`, docs/review.md) names the head commit it was computed for and tells the reviewer to apply
with `llmgw apply --expect <that commit>`. `expect_refusal` compares it with the branch head the control plane just
read: equal (or the same tree: a merge commit of the reviewed head onto an unmoved base), the apply goes on; otherwise the apply is refused with what changed since (the commits between REV
and the head, each with its author and the files it touched), or with why REV cannot be compared (it names no
commit, or the branch no longer contains it: it was rewritten).
"""

from __future__ import annotations

import os
from typing import Any

from llmgw.errors import SettingsError
from llmgw.settings import commits_since
from llmgw.settings.reading import open_repository, resolve_commit

SHOWN = 10
"""Commits named in a refusal's message (the event's "changed" list holds up to 50)."""


def _same_tree(path: str, one: str, other: str) -> bool:
    """Whether commits `one` and `other` hold the same tree (the same settings, byte for byte)."""
    repo = open_repository(path)
    return resolve_commit(repo, one).tree_id == resolve_commit(repo, other).tree_id


def expect_refusal(repo_path: str | os.PathLike[str], expect: str, head: str | None) -> dict[str, Any] | None:
    """None when `expect` (anything `git rev-parse` takes) names commit `head`, the branch head just read, or a
    commit with the very tree of `head` (a pull request merged with a merge commit: the head is the merge, its
    settings are the reviewed ones); else the apply's refusal as an event: {"event": "settings", "ok": False, "expected": REV as given, "expected_commit":
    40 hex or None, "commit": head, "changed": [{"commit", "subject", "author", "files"}], "message": sentence}.
    """
    path = str(repo_path)
    refusal: dict[str, Any] = {"event": "settings", "ok": False, "expected": expect, "expected_commit": None,
                               "commit": head, "changed": []}
    if head is None:
        return {**refusal, "message": f"the settings branch has no commit yet, so it is not {expect}: nothing to apply"}
    try:
        expected = str(resolve_commit(open_repository(path), expect).id)
    except SettingsError:
        return {**refusal, "message": (
            f"refused: {expect} names no commit of the settings repository (the branch head is {head[:12]}); give "
            "the head commit the review was computed for (its comment says `llmgw apply --expect ...`)")}
    refusal["expected_commit"] = expected
    if expected == head or _same_tree(path, expected, head):
        return None
    changed, contained = commits_since(path, expected, head)
    refusal["changed"] = [{"commit": c.commit, "subject": c.subject, "author": c.author, "files": list(c.files)}
                          for c in changed]
    if contained:
        why = (f"refused: the settings branch head is {head[:12]}, not {expected[:12]} (the revision you expected): "
               f"{len(changed)} commit{'' if len(changed) == 1 else 's'} since")
    else:
        why = (f"refused: the settings branch head is {head[:12]} and no longer contains {expected[:12]} (the "
               f"revision you expected; the branch was rewritten): {len(changed)} commit"
               f"{'' if len(changed) == 1 else 's'} on the branch that it does not have")
    lines = [f"{why}. Nothing was applied; review the head (`llmgw review`) and apply with "
             f"`llmgw apply --expect {head[:12]}`, or apply {expected[:12]} by putting it back at the head."]
    for commit in changed[:SHOWN]:
        files = ", ".join(commit.files) or "no files"
        lines.append(f"  {commit.commit[:12]} {commit.subject} ({commit.author}): {files}")
    if len(changed) > SHOWN:
        lines.append(f"  and {len(changed) - SHOWN} more")
    return {**refusal, "message": "\n".join(lines)}

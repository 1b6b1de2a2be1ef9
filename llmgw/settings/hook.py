"""What the git hooks of a settings repository decide; `llmgw.cli.hook_cmds` runs them and does their I/O.

Git runs the hooks in the bare repository with the pushed ref updates on stdin, one `<old> <new> <ref>` line each
(https://git-scm.com/docs/githooks#pre-receive). In pre-receive the pushed objects are still quarantined, so the
repository is opened from the environment (GIT_DIR, GIT_QUARANTINE_PATH, GIT_OBJECT_DIRECTORY...).

pre-receive (`judge_push`, `check_push`): a push may only move the settings branch (git config `llmgw.branch`,
default `main`) forward to a commit whose settings validate. Refused, each with a sentence: any other ref (other
branches, tags, `refs/llmgw/audit` and `refs/llmgw/applied`, which only the control plane writes), deleting the
branch, a non-fast-forward update of it, and settings that do not validate (the error list, `file:line:column:
key: reason`). Git applies all of a push's updates or none, so one refused update refuses the whole push; every
update still gets its verdict. What the pusher sees is prefixed by git with "remote:". `judge_push` also returns
the tree ids it found valid, which the hook's command records (llmgw.settings.valid_trees) so that the control
plane does not check them again.
post-receive (`notification`, defined in llmgw.settings.post_receive, which imports no more than it needs): the
URL in `llmgw.notifyurl` and the JSON body {"refs": [{"ref", "old", "new"}]} to POST there, with the token in the
git directory's `llmgw-hook-token` (the control plane accepts an unsigned notification only with it) and the CA
file in `llmgw.notifyca` (an https control plane); the POST itself is the caller's (llmgw.settings does no network
I/O).
Run as `python -m llmgw.settings.hook` (what hooks of an older llmgw run), it refuses the push and says to rewrite
the hooks with `llmgw repo hooks`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TextIO

import pygit2

from llmgw.errors import SettingsError
from llmgw.settings.loading import load_commit
from llmgw.settings.reading import open_repository, resolve_commit
from llmgw.settings.refs import APPLIED_REF, AUDIT_REF, BRANCH_KEY, DEFAULT_BRANCH, branch_ref
from llmgw.settings.post_receive import (  # Notification and notification: this module's interface too
    Notification, RefUpdate, notification, parse_updates,
)

ZERO = "0" * 40


@dataclass(frozen=True)
class PushVerdict:
    """What pre-receive decided: `status` 0 accepts the push, 1 refuses it; `valid_trees` the tree ids (40 hex) of
    the pushed commits whose settings validated, in push order (also when another update refused the push)."""

    status: int
    valid_trees: tuple[str, ...] = ()


def settings_branch(repo: pygit2.Repository) -> str:
    """The branch pushes may move: git config `llmgw.branch` (set by `llmgw repo init`), else "main"."""
    try:
        value = repo.config[BRANCH_KEY] if BRANCH_KEY in repo.config else None
    except (pygit2.GitError, KeyError, ValueError):
        value = None
    return value or DEFAULT_BRANCH


def _refusal(repo: pygit2.Repository, update: RefUpdate, branch: str) -> str | None:
    """Why `update` is refused before its settings are read (None: it may go on to validation)."""
    wanted = branch_ref(branch)
    deleting = update.new == ZERO
    if update.ref != wanted:
        verb = "to delete" if deleting else "to update" if update.old != ZERO else "to create"
        why = f"this repository takes pushes to {wanted} only"
        if update.ref in (AUDIT_REF, APPLIED_REF) or update.ref.startswith("refs/llmgw/"):
            why += "; refs/llmgw/* are the control plane's record of what it did, written by it alone"
        elif update.ref.startswith("refs/heads/"):
            why += "; propose changes on a branch of another clone or forge, and merge them into " + branch
        return f"refusing {verb} {update.ref}: {why}"
    if deleting:
        return f"refusing to delete {update.ref}: it holds the cluster's settings"
    if update.old not in (ZERO, update.new):
        try:
            forward = repo.descendant_of(update.new, update.old)
        except (pygit2.GitError, KeyError, ValueError) as exc:
            return f"refusing {update.ref} at {update.new[:12]}: cannot tell whether it follows {update.old[:12]} ({exc})"
        if not forward:
            return (f"refusing {update.ref} at {update.new[:12]}: not a fast-forward of {update.old[:12]}; the settings "
                    "history is never rewritten (the audit trail refers to it): pull, merge or rebase, and push again")
    return None


def check_push(lines: Iterable[str], repo_dir: str | os.PathLike[str], out: TextIO) -> int:
    """pre-receive: `judge_push`'s exit status only (0 accepts the push, 1 refuses it). Blocking."""
    return judge_push(lines, repo_dir, out).status


def judge_push(lines: Iterable[str], repo_dir: str | os.PathLike[str], out: TextIO) -> PushVerdict:
    """pre-receive: judge every pushed ref update, printing one verdict (and any settings issues) per update to `out`.

    Returns the hook's exit status (0 accepts the push, 1 refuses it, all of it, as git does) and the tree ids
    whose settings validated in full here. Blocking (reads the repository, quarantined objects included).
    """
    updates = parse_updates(lines)
    try:
        repo = open_repository(repo_dir, from_env=True)
    except SettingsError as exc:
        print(f"refusing the push: {exc}", file=out)
        return PushVerdict(1)
    branch = settings_branch(repo)
    refused = False
    valid: list[str] = []
    for update in updates:
        refusal = _refusal(repo, update, branch)
        if refusal is not None:
            print(refusal, file=out)
            refused = True
            continue
        try:
            settings = load_commit(repo_dir, update.new, from_env=True)
        except SettingsError as exc:
            errors = [i for i in exc.issues if i.severity == "error"]
            plural = "s" if len(errors) != 1 else ""
            print(f"refusing {update.ref} at {update.new[:12]}: {len(errors)} settings error{plural}:", file=out)
            for issue in exc.issues:
                print(f"  {issue}", file=out)
            refused = True
            continue
        valid.append(str(resolve_commit(repo, update.new).tree_id))
        for warning in settings.warnings:
            print(f"  {warning}", file=out)
        print(f"{update.ref} at {update.new[:12]}: settings valid", file=out)
    if refused and len(updates) > 1:
        print("the whole push is refused: git applies all of a push's ref updates or none", file=out)
    return PushVerdict(1 if refused else 0, tuple(valid))


def _outdated(argv: list[str]) -> int:
    """What a hook installed by an llmgw before llmgw.cli.hook_cmds does: refuse pushes (validation would be skipped
    otherwise) and say how to rewrite the hooks. Returns the exit status: 1 for pre-receive, else 0."""
    print("this repository's hooks were installed by an older llmgw; rewrite them with: llmgw repo hooks "
          f"{os.environ.get('GIT_DIR', '.')}", file=sys.stderr)
    return 1 if argv[:1] == ["pre-receive"] else 0


if __name__ == "__main__":
    sys.exit(_outdated(sys.argv[1:]))

"""Node verbs and serving as commits on the operator's behalf: `llmgw node cordon|uncordon|drain NODE`,
`llmgw slurm lend|reclaim NODE` and `llmgw stop|start`: reviewed, audited and reverted like any change.

- stop / start: `serving.stopped` in llmgw.yaml becomes true / false (`commit_serving_stopped`);

- cordon: NODE joins `serving.cordoned` in llmgw.yaml (no new replicas);
- drain: NODE joins `serving.drained` (replicas placed elsewhere first, then stopped);
- uncordon: NODE leaves both lists;
- lend / reclaim: `nodes.<NODE>.lent` in slurm.yaml becomes true / false (the node must be listed there);
- `llmgw slurm users keys add|remove EMAIL KEY`: a member's SSH public key joins or leaves `ssh_keys.<EMAIL>` in
  slurm.yaml (`commit_ssh_key`; removing without a key removes all of the member's).
Each goes through the one writer, `llmgw.settings.edit_commits.commit_edit` (comments and layout kept, the new tree
validated before the commit is written; `preview` and `expect` as it says).
"""

from __future__ import annotations

import os

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from llmgw.errors import Issue, SettingsError
from llmgw.settings.edit_commits import Edit, EditCommit, commit_edit
from llmgw.settings.refs import DEFAULT_BRANCH

NODE_VERBS = ("cordon", "uncordon", "drain")
SLURM_VERBS = ("lend", "reclaim")


def _edit_serving(node: str, verb: str) -> Edit:
    def edit(document: CommentedMap) -> bool:
        serving = document.get("serving")
        if serving is None:
            serving = document["serving"] = CommentedMap()
        wanted = {"cordon": ("cordoned",), "drain": ("drained",), "uncordon": ()}[verb]
        changed = False
        for key in ("cordoned", "drained"):
            ids = serving.get(key)
            if key in wanted and (ids is None or node not in ids):
                if ids is None:
                    ids = serving[key] = CommentedSeq()
                    ids.fa.set_flow_style()
                ids.append(node)
                changed = True
            elif key not in wanted and ids is not None and node in ids:
                ids.remove(node)
                if not ids:
                    del serving[key]
                changed = True
        return changed

    return edit


def _edit_lent(node: str, lent: bool) -> Edit:
    def edit(document: CommentedMap) -> bool:
        entry = (document.get("nodes") or {}).get(node)
        if entry is None:
            raise SettingsError([Issue("slurm.yaml", 0, 0, "nodes", f"node {node!r} is not among the nodes that may "
                                       f"be lent: add `{node}: {{partition: <name>}}` under nodes: first")])
        if bool(entry.get("lent", False)) == lent:
            return False
        if lent:
            entry["lent"] = True
        else:
            entry.pop("lent", None)
        return True

    return edit


def _same_key(stored: str, given: str) -> bool:
    """`given` names `stored` (an authorized_keys line "TYPE BASE64 [COMMENT]"): the whole line, its base64 body
    or its comment."""
    parts = stored.split(" ", 2)
    return given in (stored, *parts[1:])


def _edit_keys(email: str, keys: tuple[str, ...], add: bool) -> Edit:
    def edit(document: CommentedMap) -> bool:
        table = document.get("ssh_keys")
        if table is None:
            if not add:
                return False
            table = document["ssh_keys"] = CommentedMap()
        have = table.get(email)
        if add:
            if have is None:
                have = table[email] = CommentedSeq()
            fresh = [key for key in keys if key not in have]
            have.extend(fresh)
            return bool(fresh)
        if have is None:
            return False
        gone = [key for key in have if not keys or any(_same_key(key, given) for given in keys)]
        for key in gone:
            have.remove(key)
        if not have:
            del table[email]
        if not table:
            del document["ssh_keys"]
        return bool(gone)

    return edit


def _edit_stopped(stopped: bool) -> Edit:
    def edit(document: CommentedMap) -> bool:
        serving = document.get("serving")
        if serving is None:
            serving = document["serving"] = CommentedMap()
        if "stopped" in serving and bool(serving["stopped"]) == stopped:
            return False
        serving["stopped"] = stopped
        return True

    return edit


def commit_serving_stopped(repo_path: str | os.PathLike[str], stopped: bool, author_name: str, author_email: str,
                           branch: str = DEFAULT_BRANCH, *, expect: str = "", preview: bool = False) -> EditCommit:
    """Commit `serving.stopped: <stopped>` to llmgw.yaml (`llmgw stop` / `llmgw start`) as the operator; nothing when
    llmgw.yaml says so already. `expect`, `preview` and what is raised: `commit_edit`."""
    verb = "stop" if stopped else "start"
    return commit_edit(repo_path, "llmgw.yaml", _edit_stopped(stopped),
                       f"llmgw {verb}: serving.stopped: {'true' if stopped else 'false'}\n", author_name, author_email,
                       branch, expect=expect, preview=preview)


def commit_ssh_key(repo_path: str | os.PathLike[str], action: str, email: str, keys: tuple[str, ...],
                   author_name: str, author_email: str, branch: str = DEFAULT_BRANCH, *, expect: str = "",
                   preview: bool = False) -> EditCommit:
    """Commit `action` "add" (each of `keys`, OpenSSH public key lines, joins `ssh_keys.<email>` in slurm.yaml) or
    "remove" (each key given, matched by the whole line or by its comment, leaves it; no keys: all of the member's)
    as the operator; returns the branch head afterwards and whether it moved (`expect`, `preview`: `commit_edit`).

    Raises: SettingsError when slurm.yaml is missing, a key is not an OpenSSH public key line or the result does not
    validate; UsageError when the head is not `expect`; ValueError for another action.
    """
    if action not in ("add", "remove"):
        raise ValueError(f"unknown keys action {action!r}")
    keys = tuple(" ".join(key.split()) for key in keys)
    verb = "added to" if action == "add" else "removed from"
    return commit_edit(repo_path, "slurm.yaml", _edit_keys(email, keys, action == "add"),
                       f"llmgw slurm users keys {action} {email}\n\n{len(keys) or 'All'} SSH key(s) {verb} "
                       f"ssh_keys.{email} in slurm.yaml.\n", author_name, author_email, branch, expect=expect,
                       preview=preview)


def commit_node_verb(repo_path: str | os.PathLike[str], verb: str, node: str, author_name: str, author_email: str,
                     branch: str = DEFAULT_BRANCH, *, expect: str = "", preview: bool = False) -> EditCommit:
    """Commit `verb` ("cordon", "uncordon", "drain", "lend", "reclaim") for `node` on the settings branch as the
    operator; return the branch head afterwards and whether it moved (not when the settings already say so).
    `expect`, `preview`: `commit_edit`.

    Raises: SettingsError when the branch or file is missing, a lend/reclaim names a node slurm.yaml does not list,
    or the result does not validate (e.g. a node the fleet does not know); UsageError when the head is not `expect`.
    """
    if verb in NODE_VERBS:
        file, edit = "llmgw.yaml", _edit_serving(node, verb)
    elif verb in SLURM_VERBS:
        file, edit = "slurm.yaml", _edit_lent(node, verb == "lend")
    else:
        raise ValueError(f"unknown node verb {verb!r}")
    message = f"llmgw {'slurm ' if verb in SLURM_VERBS else 'node '}{verb} {node}\n"
    return commit_edit(repo_path, file, edit, message, author_name, author_email, branch, expect=expect,
                       preview=preview)

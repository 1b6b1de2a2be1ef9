"""Node verbs as commits on the operator's behalf: `llmgw node cordon|uncordon|drain NODE` and
`llmgw slurm lend|reclaim NODE`, like `llmgw stop` (committing.py): reviewed, audited and reverted like any change.

- cordon: NODE joins `serving.cordoned` in llmgw.yaml (no new replicas);
- drain: NODE joins `serving.drained` (replicas placed elsewhere first, then stopped);
- uncordon: NODE leaves both lists;
- lend / reclaim: `nodes.<NODE>.lent` in slurm.yaml becomes true / false (the node must be listed there);
- `llmgw slurm users keys add|remove EMAIL KEY`: a member's SSH public key joins or leaves `ssh_keys.<EMAIL>` in
  slurm.yaml (`commit_ssh_key`; removing without a key removes all of the member's).
Comments and layout are kept (ruamel.yaml round trip); the new tree is validated before the commit is written.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass

import pygit2
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from llmgw.errors import Issue, SettingsError
from llmgw.settings.committing import _move
from llmgw.settings.loading import load_tree
from llmgw.settings.reading import open_repository, read_commit, resolve_commit
from llmgw.settings.refs import DEFAULT_BRANCH, branch_ref
from llmgw.settings.repository import LLMGW_SIGNATURE, write_tree

NODE_VERBS = ("cordon", "uncordon", "drain")
SLURM_VERBS = ("lend", "reclaim")


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    return yaml


def _edit_serving(node: str, verb: str) -> Callable[[CommentedMap], bool]:
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


def _edit_lent(node: str, lent: bool) -> Callable[[CommentedMap], bool]:
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


@dataclass(frozen=True)
class NodeVerbCommit:
    """What a node verb did: `commit` is the branch head afterwards (40 hex); `changed` is False when the settings
    already said so and nothing was committed."""

    commit: str
    changed: bool


def _same_key(stored: str, given: str) -> bool:
    """`given` names `stored` (an authorized_keys line "TYPE BASE64 [COMMENT]"): the whole line, its base64 body
    or its comment."""
    parts = stored.split(" ", 2)
    return given in (stored, *parts[1:])


def _edit_keys(email: str, keys: tuple[str, ...], add: bool) -> Callable[[CommentedMap], bool]:
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


def commit_ssh_key(repo_path: str | os.PathLike[str], action: str, email: str, keys: tuple[str, ...],
                   author_name: str, author_email: str, branch: str = DEFAULT_BRANCH) -> NodeVerbCommit:
    """Commit `action` "add" (each of `keys`, OpenSSH public key lines, joins `ssh_keys.<email>` in slurm.yaml) or
    "remove" (each key given, matched by the whole line or by its comment, leaves it; no keys: all of the member's)
    as the operator; returns the branch head afterwards and whether it moved.

    Raises: SettingsError when slurm.yaml is missing, a key is not an OpenSSH public key line or the result does not
    validate; ValueError for another action.
    """
    if action not in ("add", "remove"):
        raise ValueError(f"unknown keys action {action!r}")
    keys = tuple(" ".join(key.split()) for key in keys)
    verb = "added to" if action == "add" else "removed from"
    return _commit_edit(repo_path, "slurm.yaml", _edit_keys(email, keys, action == "add"),
                        f"llmgw slurm users keys {action} {email}\n\n{len(keys) or 'All'} SSH key(s) {verb} "
                        f"ssh_keys.{email} in slurm.yaml.\n", author_name, author_email, branch)


def commit_node_verb(repo_path: str | os.PathLike[str], verb: str, node: str, author_name: str, author_email: str,
                     branch: str = DEFAULT_BRANCH) -> NodeVerbCommit:
    """Commit `verb` ("cordon", "uncordon", "drain", "lend", "reclaim") for `node` on the settings branch as the
    operator; return the branch head afterwards and whether it moved (not when the settings already say so).

    Raises: SettingsError when the branch or file is missing, a lend/reclaim names a node slurm.yaml does not list,
    or the result does not validate (e.g. a node the fleet does not know).
    """
    if verb in NODE_VERBS:
        file, edit = "llmgw.yaml", _edit_serving(node, verb)
    elif verb in SLURM_VERBS:
        file, edit = "slurm.yaml", _edit_lent(node, verb == "lend")
    else:
        raise ValueError(f"unknown node verb {verb!r}")
    message = f"llmgw {'slurm ' if verb in SLURM_VERBS else 'node '}{verb} {node}\n"
    return _commit_edit(repo_path, file, edit, message, author_name, author_email, branch)


def _commit_edit(repo_path: str | os.PathLike[str], file: str, edit: Callable[[CommentedMap], bool], message: str,
                 author_name: str, author_email: str, branch: str) -> NodeVerbCommit:
    """Apply `edit` to `file` of the branch head (round trip), validate the new tree, commit it as the operator."""
    repo = open_repository(repo_path)
    main = branch_ref(branch)
    head = resolve_commit(repo, main)
    try:
        text = repo[head.tree[file].id].data.decode("utf-8")
    except KeyError as exc:
        raise SettingsError([Issue(file, 0, 0, "", f"is missing from {main}")]) from exc
    yaml = _yaml()
    document = yaml.load(text)
    if not edit(document):
        return NodeVerbCommit(str(head.id), changed=False)
    buffer = io.StringIO()
    yaml.dump(document, buffer)
    new_text = buffer.getvalue()
    tree_files = read_commit(repo, head)
    tree_files.texts[file] = new_text
    load_tree(tree_files)  # raises SettingsError when the edit would not validate
    tree = write_tree(repo, {file: new_text.encode("utf-8")}, head.tree)
    commit = repo.create_commit(None, pygit2.Signature(author_name, author_email),
                                pygit2.Signature(*LLMGW_SIGNATURE), message, tree, [head.id])
    _move(repo, main, commit, head.id, message.splitlines()[0].strip())
    return NodeVerbCommit(str(commit), changed=True)

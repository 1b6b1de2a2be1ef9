"""The one writer of settings commits made on a person's behalf: one YAML file of the branch head edited in a round
trip (comments and layout kept, ruamel.yaml), the new tree validated as `llmgw validate` validates it, the commit
authored by the person and committed by llmgw. Every imperative change goes through `commit_edit`: `llmgw stop|start`
and the node verbs (node_commits.py), a model's replicas and adapters (model_commits.py), SSH keys (node_commits.py),
whether the CLI, the admin API or the console asked for it.

Two options make it safe to show before doing: `preview` writes nothing and returns the unified diff the commit would
make; `expect` (a commit id, the head a preview was made against) refuses the commit when the branch moved since
(someone pushed meanwhile), so a person never confirms one diff and gets another. Refs are written by pygit2 directly
(`committing._move`: compare and swap), so the repository's hooks do not run for these commits.
"""

from __future__ import annotations

import difflib
import io
import os
from collections.abc import Callable
from dataclasses import dataclass

import pygit2
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from llmgw.errors import Issue, SettingsError, UsageError
from llmgw.settings.committing import _move
from llmgw.settings.loading import load_tree
from llmgw.settings.reading import TreeFiles, open_repository, read_commit, resolve_commit
from llmgw.settings.refs import branch_ref
from llmgw.settings.repository import LLMGW_SIGNATURE, write_tree

Edit = Callable[[CommentedMap], bool]
"""Changes a settings file's document in place; True when it changed anything (False: the settings say so already)."""
FileOf = Callable[[TreeFiles], str]
"""Which file of the head's tree an edit is for (e.g. the catalog file of a model), or SettingsError saying why none."""


@dataclass(frozen=True)
class EditCommit:
    """What an edit did, or would do: `commit` the branch head afterwards (40 hex; in a preview, the head the diff was
    made against: pass it as `expect` to commit exactly that); `changed` False when the settings already said so and
    nothing was (or would be) committed; `diff` the unified diff of the edited file ("" when unchanged); `preview` True
    when nothing was written."""

    commit: str
    changed: bool
    diff: str = ""
    preview: bool = False


def round_trip_yaml() -> YAML:
    """The YAML reader and writer of every edit: comments, quotes and layout kept, no line folded."""
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    return yaml


SEQUENCE_STYLES = ((2, 2, 0), (2, 4, 2))
"""The block-sequence indents (mapping, sequence, offset) settings files are written in: `key:\n- item` (ruamel's
default) and `key:\n  - item` (the examples' and most editors')."""


def _dumped_like(document: CommentedMap, original: str) -> str:
    """`document` written in the sequence style of `original` (of SEQUENCE_STYLES, the one that changes the fewest of
    its lines): ruamel keeps comments and quotes but not how a file indents its lists, and a diff must show only the
    edit. A new file (`original` empty) is written in the examples' style, `key:\n  - item`."""
    best: tuple[int, str] | None = None
    before = original.splitlines()
    for mapping, sequence, offset in SEQUENCE_STYLES if original.strip() else SEQUENCE_STYLES[1:]:
        yaml = round_trip_yaml()
        yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
        buffer = io.StringIO()
        yaml.dump(document, buffer)
        text = buffer.getvalue()
        changed = sum(1 for line in difflib.ndiff(before, text.splitlines()) if line[:1] in "+-")
        if best is None or changed < best[0]:
            best = (changed, text)
    assert best is not None
    return best[1]


def _moved_since(repo: pygit2.Repository, main: str, head: pygit2.Commit, expect: str) -> UsageError:
    summary = head.message.splitlines()[0] if head.message.strip() else ""
    return UsageError(f"the settings branch {main} moved since this change was shown (it was at {expect[:12]}; it is "
                      f"now at {str(head.id)[:12]}, \"{summary}\" by {head.author.name} <{head.author.email}>): "
                      "nothing was committed; look at the change again against the new head and confirm it")


def commit_edit(repo_path: str | os.PathLike[str], file: str | FileOf, edit: Edit, message: str, author_name: str,
                author_email: str, branch: str, *, expect: str = "", preview: bool = False,
                create: bool = False) -> EditCommit:
    """Apply `edit` to `file` of branch `branch`'s head, validate the new tree and commit it as `author_name`
    <`author_email`> (llmgw the committer) with `message`; with `preview`, write nothing and say what would change.

    `expect`: the commit id the branch head must be (a preview's `commit`); "" takes the head as it is. `create`: the
    file may be missing from the head (a new file: `edit` gets an empty document, the diff is against nothing).
    Returns the `EditCommit`. Raises: SettingsError when the branch or file is missing, the edit refuses (its
    sentence), or the result does not validate (`llmgw validate`'s issues, file and line); UsageError when the head is
    not `expect` (someone pushed meanwhile: nothing is committed). Blocking (git): run it in a worker thread.
    """
    repo = open_repository(repo_path)
    main = branch_ref(branch)
    head = resolve_commit(repo, main)
    if expect and str(head.id) != expect:
        raise _moved_since(repo, main, head, expect)
    tree_files = read_commit(repo, head)
    path = file(tree_files) if callable(file) else file
    text = tree_files.texts.get(path)
    if text is None and not create:
        raise SettingsError([Issue(path, 0, 0, "", f"is missing from {main}")])
    text = text or ""
    document = round_trip_yaml().load(text)
    if document is None:
        document = CommentedMap()
    if not edit(document):
        return EditCommit(str(head.id), changed=False, preview=preview)
    new_text = _dumped_like(document, text)
    tree_files.texts[path] = new_text
    load_tree(tree_files)  # raises SettingsError when the edit would not validate
    diff = "".join(difflib.unified_diff(text.splitlines(keepends=True), new_text.splitlines(keepends=True),
                                        f"a/{path}", f"b/{path}"))
    if preview:
        return EditCommit(str(head.id), changed=True, diff=diff, preview=True)
    tree = write_tree(repo, {path: new_text.encode("utf-8")}, head.tree)
    commit = repo.create_commit(None, pygit2.Signature(author_name, author_email),
                                pygit2.Signature(*LLMGW_SIGNATURE), message, tree, [head.id])
    _move(repo, main, commit, head.id, message.splitlines()[0].strip())
    return EditCommit(str(commit), changed=True, diff=diff)

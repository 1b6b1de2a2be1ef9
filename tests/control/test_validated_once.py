"""A settings commit is validated once: the pre-receive hook records the trees it found valid, and the watcher does
not schema-check those again; every other commit (no hook, another llmgw's record, a damaged record) is validated
in full, and an invalid one is refused.

Pushes go through the real `git` CLI (hooks and all) from a clone of a bare repository made by `init_repository`.
The watcher is given a schema check that counts the files it checks and then runs the real one."""

from __future__ import annotations

from pathlib import Path

import pygit2

from llmgw.cli.hook_cmds import record_valid_trees
from llmgw.control.watching import SettingsWatcher
from llmgw.settings import VALID_TREES_FILE, load_commit, read_valid_trees, validate_data, validation_key
from llmgw.settings.parsing import Parsed

from .conftest import git
from .test_in_process_fleet import commit_directly


class CountingSchemaCheck:
    """`validate_data`, remembering the file of each call."""

    def __init__(self) -> None:
        self.files: list[str] = []

    def __call__(self, kind: str, file: str, parsed: Parsed) -> list:
        self.files.append(file)
        return validate_data(kind, file, parsed)


def clone(bare: Path, work: Path) -> Path:
    git("clone", "-q", str(bare), str(work), cwd=bare.parent)
    return work


def push_change(work: Path, rel: str, old: str, new: str) -> str:
    """Replace `old` by `new` in `rel`, commit and push to origin main; return the new head (40 hex)."""
    path = work / rel
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    git("commit", "-qam", f"edit {rel}", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    return git("rev-parse", "HEAD", cwd=work).strip()


def tree_of(bare: Path, commit: str) -> str:
    return str(pygit2.Repository(str(bare))[commit].peel(pygit2.Commit).tree_id)


async def test_a_push_through_the_hook_is_recorded_and_the_watcher_does_not_check_its_schema_again(
    tmp_path, settings_repo,
):
    check = CountingSchemaCheck()
    watcher = SettingsWatcher(str(settings_repo), "main", tmp_path / "unused", check_schema=check)
    await watcher.poll()
    assert "catalog/tiny.yaml" in check.files  # the seed was written by `repo init`, not pushed: checked in full

    head = push_change(clone(settings_repo, tmp_path / "work"), "catalog/tiny.yaml", "replicas: 1", "replicas: 2")
    assert tree_of(settings_repo, head) in read_valid_trees(settings_repo)
    check.files.clear()
    state = await watcher.poll()
    assert state.settings.commit == head and state.bad is None
    assert check.files == []
    full = load_commit(settings_repo, head)  # the same Settings as a full validation builds, warnings included
    assert state.settings == full and state.settings.warnings == full.warnings
    assert state.settings.models["tiny"].replicas == 2

    forged = commit_directly(settings_repo, "README.md", b"written by a forge\n", "no hook ran")
    state = await watcher.poll()
    assert state.settings.commit == forged and "catalog/tiny.yaml" in check.files


async def test_an_invalid_commit_pushed_to_a_repository_without_hooks_is_refused_by_the_watcher(
    tmp_path, settings_repo,
):
    for hook in (settings_repo / "hooks").iterdir():
        hook.unlink()
    watcher = SettingsWatcher(str(settings_repo), "main", tmp_path / "unused")
    good = (await watcher.poll()).settings
    work = clone(settings_repo, tmp_path / "work")
    bad = push_change(work, "catalog/tiny.yaml", "replicas: 1", "replicas: many")  # accepted: nothing checks it
    assert tree_of(settings_repo, bad) not in read_valid_trees(settings_repo)
    state = await watcher.poll()
    assert state.head == bad and state.settings is good
    (issue,) = [i for i in state.bad.issues if i.severity == "error"]
    assert (issue.file, issue.line, issue.key_path) == ("catalog/tiny.yaml", 8, "replicas")
    assert "'many' is not of type 'integer'" in issue.message and bad[:12] in state.bad.describe()


async def test_a_tree_recorded_by_another_llmgw_version_is_validated_again(tmp_path, settings_repo):
    check = CountingSchemaCheck()
    watcher = SettingsWatcher(str(settings_repo), "main", tmp_path / "unused", check_schema=check)
    good = (await watcher.poll()).settings
    bad = commit_directly(settings_repo, "catalog/tiny.yaml", b"name: tiny\nengine: llama.cpp\nreplicas: many\n", "bad")
    other = validation_key("0.0.1")
    assert other != validation_key()
    record_valid_trees(settings_repo, [tree_of(settings_repo, bad)], key=other)  # what an older llmgw's hook wrote
    check.files.clear()
    state = await watcher.poll()
    assert "catalog/tiny.yaml" in check.files
    assert state.settings is good and state.bad is not None and state.bad.commit == bad


async def test_a_damaged_record_is_not_trusted_and_crashes_nothing(tmp_path, settings_repo):
    check = CountingSchemaCheck()
    watcher = SettingsWatcher(str(settings_repo), "main", tmp_path / "unused", check_schema=check)
    await watcher.poll()
    work = clone(settings_repo, tmp_path / "work")
    record = settings_repo / VALID_TREES_FILE
    head = push_change(work, "catalog/tiny.yaml", "replicas: 1", "replicas: 2")
    intact = record.read_bytes()
    tree = tree_of(settings_repo, head)
    damaged = {
        "an edited entry": intact.replace(tree.encode(), tree[:-1].encode() + (b"0" if tree[-1] != "0" else b"1")),
        "an added entry": intact.replace(b"\nsha256", f"\n{validation_key()} {'a' * 40}\nsha256".encode()),
        "truncated": intact[: len(intact) // 2],
        "bytes that are not UTF-8": b"\xff\xfe" + intact,
        "garbage": bytes(range(256)) * 8,
        "empty": b"",
        "too large": intact + b"#" * (128 * 1024),
    }
    for what, data in damaged.items():
        record.write_bytes(data)
        assert read_valid_trees(settings_repo) == frozenset(), what
        check.files.clear()
        state = await watcher.poll(force=True)
        assert state.settings.commit == head and state.bad is None, what
        assert "catalog/tiny.yaml" in check.files, what
    record.unlink()
    record.mkdir()  # not even a file: the watcher validates in full, the hook warns and accepts the push
    state = await watcher.poll(force=True)
    assert state.settings.commit == head and state.bad is None
    (work / "README.md").write_text("notes\n")
    git("add", "README.md", cwd=work)
    git("commit", "-qm", "a note", cwd=work)
    pushed = git("push", "origin", "main", cwd=work)
    assert "settings valid" in pushed and "could not record the valid settings tree" in pushed
    state = await watcher.poll()
    assert state.settings.commit == git("rev-parse", "HEAD", cwd=work).strip()

    record.rmdir()
    record.write_bytes(b"garbage\n")
    push_change(work, "catalog/tiny.yaml", "replicas: 2", "replicas: 3")  # the hook replaces a damaged record
    assert len(read_valid_trees(settings_repo)) == 1

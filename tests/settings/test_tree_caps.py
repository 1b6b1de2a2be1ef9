"""A settings commit is read within caps (issue 26, a LOW item): a "git bomb" (10 entries per level naming one
subtree, 9 levels: a few kilobytes, 10^9 paths) hung the pre-receive hook, `llmgw review` and the watcher for hours;
now it is refused within seconds with a sentence naming the cap, as are trees nested too deep or holding too many
bytes of YAML."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pygit2
import pytest

from llmgw.errors import SettingsError
from llmgw.settings import load_commit, load_directory, reading
from llmgw.settings.hook import judge_push
from settings_trees import EXAMPLE, commit_tree, copy_example

SIGNATURE = pygit2.Signature("t", "t@example.org", 1_800_000_000, 0)


def _bomb(repo: pygit2.Repository, levels: int, fan_out: int = 10) -> str:
    """A commit of examples/cluster-repo plus `bomb/` whose every directory names the one below `fan_out` times."""
    base = repo[commit_tree(repo, copy_example(Path(repo.path).parent / "tree"), "example")]
    blob = repo.create_blob(b"name: x\n")
    builder = repo.TreeBuilder()
    builder.insert("leaf.txt", blob, pygit2.enums.FileMode.BLOB)  # not YAML: only the entries count
    tree = builder.write()
    for _ in range(levels):
        builder = repo.TreeBuilder()
        for i in range(fan_out):
            builder.insert(f"d{i}", tree, pygit2.enums.FileMode.TREE)
        tree = builder.write()
    top = repo.TreeBuilder(base.tree)
    top.insert("bomb", tree, pygit2.enums.FileMode.TREE)
    return str(repo.create_commit("refs/heads/bomb", SIGNATURE, SIGNATURE, "bomb", top.write(), [base.id]))


def test_a_git_bomb_is_refused_within_seconds_naming_the_cap(tmp_path):
    repo = pygit2.init_repository(str(tmp_path / "repo.git"), bare=True, initial_head="main")
    bomb = _bomb(repo, 9)
    began = time.monotonic()
    with pytest.raises(SettingsError, match="MAX_TREE_ENTRIES"):
        load_commit(str(tmp_path / "repo.git"), bomb)
    out = io.StringIO()
    verdict = judge_push([f"{'0' * 40} {bomb} refs/heads/main"], str(tmp_path / "repo.git"), out)
    assert verdict.status == 1 and "MAX_TREE_ENTRIES" in out.getvalue()
    assert time.monotonic() - began < 10


def test_a_tree_nested_too_deep_is_refused_naming_the_cap(tmp_path):
    tree = copy_example(tmp_path / "tree")
    deep = tree.joinpath(*[f"d{i}" for i in range(reading.MAX_TREE_DEPTH + 1)])
    deep.mkdir(parents=True)
    (deep / "x.yaml").write_text("a: 1\n")
    with pytest.raises(SettingsError, match="MAX_TREE_DEPTH"):
        load_directory(tree)


def test_too_many_bytes_of_yaml_are_refused_naming_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(reading, "MAX_TREE_BYTES", 5_000)  # the example holds about 11 kB of YAML
    with pytest.raises(SettingsError, match="MAX_TREE_BYTES"):
        load_directory(EXAMPLE)
    monkeypatch.setattr(reading, "MAX_TREE_BYTES", 10_000_000)
    monkeypatch.setattr(reading, "MAX_YAML_FILES", 3)
    with pytest.raises(SettingsError, match="MAX_YAML_FILES"):
        load_directory(EXAMPLE)


def test_the_example_and_a_fleet_sized_tree_are_within_the_caps():
    load_directory(EXAMPLE)
    # a file per node for 2,000 nodes (docs/scale.md), ten times over, stays under the caps
    assert reading.MAX_YAML_FILES >= 10 * 2000 and reading.MAX_TREE_ENTRIES >= 20 * 2000

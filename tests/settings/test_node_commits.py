"""`llmgw node cordon|uncordon|drain` and `llmgw slurm lend|reclaim` as commits authored by the operator
(llmgw.settings.node_commits)."""

from __future__ import annotations

from pathlib import Path

import pygit2
import pytest

from llmgw.errors import SettingsError
from llmgw.settings import init_repository, load_commit
from llmgw.settings.node_commits import commit_node_verb
from settings_trees import EXAMPLE

NODE = "gpu-node-01"


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    init_repository(tmp_path / "settings.git", EXAMPLE)
    return tmp_path / "settings.git"


def test_cordon_drain_and_uncordon_are_commits_by_the_operator(bare: Path) -> None:
    first = commit_node_verb(bare, "cordon", NODE, "Alice", "alice@acme.example")
    assert first.changed
    commit = pygit2.Repository(str(bare))[first.commit]
    assert commit.message == f"llmgw node cordon {NODE}\n" and commit.author.email == "alice@acme.example"
    assert load_commit(bare).cluster.cordoned == (NODE,)
    again = commit_node_verb(bare, "cordon", NODE, "Alice", "alice@acme.example")
    assert (again.commit, again.changed) == (first.commit, False)  # already so: no commit
    commit_node_verb(bare, "drain", NODE, "Alice", "alice@acme.example")
    cluster = load_commit(bare).cluster
    assert (cluster.cordoned, cluster.drained) == ((), (NODE,))
    commit_node_verb(bare, "uncordon", NODE, "Alice", "alice@acme.example")
    cluster = load_commit(bare).cluster
    assert (cluster.cordoned, cluster.drained) == ((), ())


def test_the_edit_keeps_the_comments_of_llmgw_yaml(bare: Path) -> None:
    commit_node_verb(bare, "cordon", NODE, "Alice", "alice@acme.example")
    repo = pygit2.Repository(str(bare))
    head = repo.references["refs/heads/main"].peel(pygit2.Commit)
    text = repo[head.tree["llmgw.yaml"].id].data.decode()
    assert "# true: every replica stops and the gateway answers 503" in text
    assert f"  cordoned: [{NODE}]\n" in text


def test_cordoning_a_node_the_settings_do_not_name_is_committed_with_a_warning(bare: Path) -> None:
    # the demo's node ("vm", the hostname) has no agents/nodes file: cordoning it must work
    commit_node_verb(bare, "cordon", "ghost", "Alice", "alice@acme.example")
    settings = load_commit(bare)
    assert settings.cluster.cordoned == ("ghost",)
    assert any("no agents/nodes/ghost.yaml" in str(w) for w in settings.warnings)


def test_lend_and_reclaim_set_and_clear_lent_in_slurm_yaml(bare: Path) -> None:
    commit_node_verb(bare, "lend", NODE, "Bob", "bob@acme.example")
    assert load_commit(bare).slurm.lent == {NODE}
    commit_node_verb(bare, "reclaim", NODE, "Bob", "bob@acme.example")
    assert load_commit(bare).slurm.lent == frozenset()
    repo = pygit2.Repository(str(bare))
    head = repo.references["refs/heads/main"].peel(pygit2.Commit)
    assert head.message == f"llmgw slurm reclaim {NODE}\n"


def test_lending_a_node_slurm_yaml_does_not_list_is_refused_with_what_to_add(bare: Path) -> None:
    with pytest.raises(SettingsError, match="add `gpu-node-02: {partition: <name>}`"):
        commit_node_verb(bare, "lend", "gpu-node-02", "Bob", "bob@acme.example")

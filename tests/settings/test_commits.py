"""Commits llmgw writes itself: stop/start on main, the audit chain, refs, the audit log."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pygit2
import pytest

from llmgw.errors import SettingsError
from llmgw.settings import (
    APPLIED_REF, AUDIT_REF, append_audit, init_repository, load_commit, read_audit_file, read_audit_log, set_ref,
)
from llmgw.settings.node_commits import commit_serving_stopped
from settings_trees import EXAMPLE


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    init_repository(tmp_path / "settings.git", EXAMPLE)
    return tmp_path / "settings.git"


def test_stop_commits_serving_stopped_keeping_comments_and_authored_by_the_operator(bare: Path) -> None:
    before = load_commit(bare)
    commit_id = commit_serving_stopped(bare, True, "Alice Operator", "alice@acme.example").commit
    repo = pygit2.Repository(str(bare))
    commit = repo[commit_id]
    assert str(repo.references["refs/heads/main"].target) == commit_id
    assert commit.parents[0].id == pygit2.Oid(hex=before.commit)
    assert (commit.author.name, commit.author.email) == ("Alice Operator", "alice@acme.example")
    assert commit.message == "llmgw stop: serving.stopped: true\n"
    old_text = repo[commit.parents[0].tree["llmgw.yaml"].id].data.decode()  # the seed, modeline rewritten
    new_text = repo[commit.tree["llmgw.yaml"].id].data.decode()
    changed = [(a, b) for a, b in zip(old_text.splitlines(), new_text.splitlines()) if a != b]
    assert len(old_text.splitlines()) == len(new_text.splitlines())
    assert changed == [("  stopped: false           # true: every replica stops and the gateway answers 503 (llmgw stop / start)",
                        "  stopped: true            # true: every replica stops and the gateway answers 503 (llmgw stop / start)")]
    after = load_commit(bare)
    assert after.cluster.serving_stopped is True
    assert after.models == before.models and after.projects == before.projects


def test_start_after_stop_restores_the_value_and_a_repeat_commits_nothing(bare: Path) -> None:
    stopped = commit_serving_stopped(bare, True, "A", "a@x").commit
    assert commit_serving_stopped(bare, True, "A", "a@x").commit == stopped
    started = commit_serving_stopped(bare, False, "B", "b@x").commit
    assert started != stopped
    assert load_commit(bare).cluster.serving_stopped is False
    log = subprocess.run(["git", "--git-dir", str(bare), "log", "--format=%an %s", "main"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert log[:2] == ["B llmgw start: serving.stopped: false", "A llmgw stop: serving.stopped: true"]


def test_stop_adds_the_serving_section_when_llmgw_yaml_has_none(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    import shutil

    shutil.copytree(EXAMPLE, seed)
    text = (seed / "llmgw.yaml").read_text()
    start = text.index("serving:")
    end = text.index("limits:")
    (seed / "llmgw.yaml").write_text(text[:start] + "serving:\n  allow_empty: false\n" + text[end:])
    init_repository(tmp_path / "s.git", seed)
    commit_serving_stopped(tmp_path / "s.git", True, "A", "a@x").commit
    assert load_commit(tmp_path / "s.git").cluster.serving_stopped is True


def test_audit_commits_form_a_chain_on_their_own_ref(bare: Path) -> None:
    main_before = str(pygit2.Repository(str(bare)).references["refs/heads/main"].target)
    first = append_audit(bare, {"nodes/local.json": b'{"state": "ready"}\n', "summary.json": b"{}\n"}, "pass 1: start gemma-3-270m-0")
    second = append_audit(bare, {"nodes/local.json": b'{"state": "stopped"}\n', "summary.json": None}, "pass 2: stop gemma-3-270m-0")
    repo = pygit2.Repository(str(bare))
    assert str(repo.references[AUDIT_REF].target) == second
    assert [str(p) for p in repo[second].parent_ids] == [first]
    assert repo[first].parents == []
    assert str(repo.references["refs/heads/main"].target) == main_before  # settings branch untouched
    entries = read_audit_log(bare, 10)
    assert [e.commit for e in entries] == [second, first]
    assert entries[0].message == "pass 2: stop gemma-3-270m-0\n"
    assert entries[0].files == ("nodes/local.json", "summary.json")
    assert entries[1].files == ("nodes/local.json", "summary.json")
    assert entries[0].author == "llmgw <llmgw@localhost>" and entries[0].time > 0
    assert read_audit_file(bare, "nodes/local.json") == b'{"state": "stopped"}\n'
    assert read_audit_file(bare, "summary.json") is None
    assert read_audit_file(bare, "summary.json", first) == b"{}\n"
    assert read_audit_log(bare, 1) == entries[:1]


def test_an_audit_message_holding_a_nul_or_escape_is_written_with_them_escaped(bare: Path) -> None:
    # an agent's error text reaches the audit message as it came (the fuzzing test sent a NUL): git refuses a NUL
    # in the reflog message, and the writer would retry that commit for ever, holding back every later one
    commit = append_audit(bare, {"status.yaml": b"{}\n"}, "pass 3: start x\x00y on n1\n\n- failed: \x1b[31mboom\tend")
    entries = read_audit_log(bare, 1)
    assert entries[0].commit == commit
    assert entries[0].message == "pass 3: start x\\x00y on n1\n\n- failed: \\x1b[31mboom\tend\n"
    assert read_audit_file(bare, "status.yaml") == b"{}\n"


def test_an_empty_audit_log_is_an_empty_list(bare: Path) -> None:
    assert read_audit_log(bare, 5) == []
    assert read_audit_file(bare, "x") is None


def test_set_ref_points_applied_at_a_settings_commit(bare: Path) -> None:
    head = str(pygit2.Repository(str(bare)).references["refs/heads/main"].target)
    set_ref(bare, APPLIED_REF, head)
    stopped = commit_serving_stopped(bare, True, "A", "a@x").commit
    set_ref(bare, APPLIED_REF, stopped)
    assert str(pygit2.Repository(str(bare)).references[APPLIED_REF].target) == stopped
    with pytest.raises(SettingsError, match="names no commit"):
        set_ref(bare, APPLIED_REF, "0" * 40)

"""`llmgw review BASE HEAD --fleet FILE` on real git repositories: exit codes and documents. The command runs in the
test's process (support.in_process_cli, as its console script runs it); `test_errors_exit_1_with_a_sentence` runs it
as a real process, for the exit status and the streams of one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from review_repos import (
    CPU_NODE, GPU_NODE, branch, example_fleet, example_repo, example_snapshot, git, replicas, write_snapshot,
)

from support.in_process_cli import completed

from llmgw.settings import load_commit


def llmgw(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return completed(list(args), cwd=cwd)


def llmgw_process(*args: str) -> subprocess.CompletedProcess:
    """`python -m llmgw.cli ARGS` as a real process."""
    return subprocess.run([sys.executable, "-m", "llmgw.cli", *args], capture_output=True, text=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return example_repo(tmp_path / "settings")


@pytest.fixture
def snapshot(repo: Path, tmp_path: Path) -> Path:
    return example_snapshot(repo, tmp_path / "fleet.json")


def review(repo: Path, snapshot: Path, head: str, *extra: str, process: bool = False) -> subprocess.CompletedProcess:
    return (llmgw_process if process else llmgw)("review", "main", head, "--repo", str(repo), "--fleet", str(snapshot),
                                                 *extra)


def test_a_model_that_fits_exits_2_and_lists_its_placement(repo, snapshot):
    head = branch(repo, "add-70b", [replicas(1)])
    done = review(repo, snapshot, "add-70b")
    assert done.returncode == 2, done.stderr
    text = done.stdout
    assert text.startswith(f"<!-- llmgw-review base={git(repo, 'rev-parse', 'main')} head={head} fleet=sha256:")
    assert "## llmgw review: fits" in text
    assert f"**{GPU_NODE}** (1 to start; 0 kept)" in text
    assert "- start `llama-3.1-70b-instruct-0/0` on GPU 0,1: new replica" in text
    assert "| GPU h100-80g | 7 | 7 | 5 | 7 / 5 |" in text  # GPU 7 is ignored by the node's agent settings
    assert "```diff\n~ model llama-3.1-70b-instruct\n    replicas: 0 -> 1\n```" in text
    assert "taken 2026-12-01T02:00:00Z" in text


def test_a_model_that_does_not_fit_exits_3_with_every_nodes_reason(repo, snapshot):
    branch(repo, "add-five", [replicas(5)])
    done = review(repo, snapshot, "add-five", "--json")
    assert done.returncode == 3, done.stderr
    document = json.loads(done.stdout)
    assert document["verdict"] == "does not fit" and document["exit_code"] == 3 and not document["fits"]
    unplaced = {u["replica_id"]: u for u in document["unplaced"]}
    assert sorted(unplaced) == ["llama-3.1-70b-instruct-3", "llama-3.1-70b-instruct-4"]
    reasons = {r["node"]: r["reason"] for r in unplaced["llama-3.1-70b-instruct-4"]["reasons"]}
    assert reasons == {CPU_NODE: "labels do not match node_selector zone=eu-west-1",
                       GPU_NODE: "1 of 2 h100-80g free (6 held by shards)"}
    assert all(u["new"] for u in document["unplaced"])
    steps = [s["subject"] for n in document["nodes"] for s in n["steps"]]
    assert steps == [f"llama-3.1-70b-instruct-{i}/0" for i in range(3)]
    assert document["headroom"]["gpus"] == [{"gpu_class": "h100-80g", "devices": 7, "free_before": 7,
                                             "free_after": 1, "largest_before": 7, "largest_after": 1}]

    markdown = review(repo, snapshot, "add-five", "--format", "markdown")
    assert markdown.returncode == 3
    assert "### Cannot be placed (2)" in markdown.stdout
    assert f"| `llama-3.1-70b-instruct-3` | {CPU_NODE} | labels do not match node_selector zone=eu-west-1 |" \
        in markdown.stdout


def test_a_quota_change_alone_exits_2_with_no_plan_changes_and_the_project_listed(repo, snapshot):
    branch(repo, "more-ci", [("projects.yaml", "requests_per_minute: 120", "requests_per_minute: 240")])
    done = review(repo, snapshot, "more-ci", "--json")
    assert done.returncode == 2, done.stderr
    document = json.loads(done.stdout)
    assert document["verdict"] == "fits" and not document["plan"]["changes"]
    assert all(not n["steps"] for n in document["nodes"])
    assert document["projects"] == [{
        "project": "ci", "action": "changed", "models_added": [], "models_removed": [], "prices": [],
        "quotas": [{"subject": "project ci", "key": "requests_per_minute", "old": "120", "new": "240"}],
    }]
    markdown = review(repo, snapshot, "more-ci").stdout
    assert "No replica starts, stops or moves (2 shards kept as they are)." in markdown
    assert "| `ci` | project ci: requests_per_minute | 120 | 240 |" in markdown


def test_the_same_settings_exit_0(repo, snapshot):
    done = review(repo, snapshot, "main", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["verdict"] == "no change" and not document["settings_diff"]["changed"]
    assert [w["kind"] for w in document["warnings"]] == ["settings"]  # gemma pinned by sha256 alone
    assert document["warnings"][0]["new"] is False and "sha256 alone" in document["warnings"][0]["text"]


def test_a_price_change_shows_under_every_project_that_may_use_the_model(repo, snapshot):
    branch(repo, "dearer", [("catalog/gemma-3-270m.yaml", "prompt_per_million: 0.01", "prompt_per_million: 0.02")])
    document = json.loads(review(repo, snapshot, "dearer", "--json").stdout)
    assert [p["project"] for p in document["projects"]] == ["assistants", "ci", "demo"]
    assert all(p["prices"] == [{"subject": "model gemma-3-270m", "key": "prompt_per_million", "old": "0.01",
                                "new": "0.02"}] for p in document["projects"])


def test_pickles_allowed_and_keys_not_acted_on_are_new_warnings(repo, snapshot):
    branch(repo, "risky", [("catalog/gemma-3-270m.yaml", "context_size: 2048", "context_size: 2048\nallow_pickle: true"),
                           ("agents/nodes/gpu-node-01.yaml", "# fabrics:", "fabrics:")])
    document = json.loads(review(repo, snapshot, "risky", "--json").stdout)
    kinds = {w["kind"]: w for w in document["warnings"]}
    assert kinds["pickle"]["new"] and "catalog/gemma-3-270m.yaml: allow_pickle: true" in kinds["pickle"]["text"]
    assert kinds["not-acted-on"]["new"] and kinds["not-acted-on"]["text"].startswith(
        "agents/nodes/gpu-node-01.yaml:7:1: fabrics:")


def test_a_stored_review_is_stale_once_the_base_moves_or_the_plan_changes(repo, snapshot, tmp_path):
    branch(repo, "add-70b", [replicas(1)])
    stored = tmp_path / "review.json"
    assert review(repo, snapshot, "add-70b", "--json-file", str(stored)).returncode == 2
    done = review(repo, snapshot, "add-70b", "--check", str(stored))
    assert done.returncode == 0 and "still holds" in done.stdout

    # A fleet whose free GPU memory moved plans the same: the review still holds.
    settings = load_commit(repo, "main")
    fleet = example_fleet(settings)
    moved = tmp_path / "moved.json"
    write_snapshot(moved, fleet, settings.commit, taken_at="2026-12-01T03:00:00Z")
    assert review(repo, moved, "add-70b", "--check", str(stored)).returncode == 0

    # The GPU node gone: the plan changes.
    lost = tmp_path / "lost.json"
    write_snapshot(lost, type(fleet)(fleet.nodes[1:]), settings.commit, taken_at="2026-12-01T03:00:00Z")
    done = review(repo, lost, "add-70b", "--check", str(stored))
    assert done.returncode == 4
    assert "the plan changed" in done.stderr and "no longer: start llama-3.1-70b-instruct-0/0" in done.stderr
    assert "now: cannot place llama-3.1-70b-instruct-0" in done.stderr

    # The base branch moved on.
    old_base = git(repo, "rev-parse", "main")
    (repo / "README.md").write_text("notes\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "a note")
    done = review(repo, snapshot, "add-70b", "--check", str(stored))
    assert done.returncode == 4
    assert f"base main was {old_base[:12]} and is {git(repo, 'rev-parse', 'main')[:12]} now" in done.stderr


def test_errors_exit_1_with_a_sentence(repo, snapshot, tmp_path):
    done = review(repo, snapshot, "no-such-branch", process=True)
    assert done.returncode == 1 and "HEAD no-such-branch does not load" in done.stderr and done.stdout == ""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "nodes": [{"node_id": "n1", "gpus": [{"device_id": "0"}]}]}))
    done = review(repo, bad, "main")
    assert done.returncode == 1
    assert f"error: {bad} is not a fleet snapshot: nodes[0].gpus[0].gpu_class: missing" in done.stderr
    branch(repo, "broken", [(LLAMA_FILE, "\nreplicas: 0\n", "\nreplicas: many\n")])
    done = review(repo, snapshot, "broken")
    assert done.returncode == 1 and "catalog/llama-3.1-70b-instruct.yaml" in done.stderr


def test_the_markdown_can_go_to_a_file_and_the_json_beside_it(repo, snapshot, tmp_path):
    branch(repo, "add-70b", [replicas(1)])
    out, js = tmp_path / "review.md", tmp_path / "review.json"
    done = review(repo, snapshot, "add-70b", "-o", str(out), "--json-file", str(js))
    assert done.returncode == 2 and done.stdout == ""
    assert out.read_text().startswith("<!-- llmgw-review") and json.loads(js.read_text())["verdict"] == "fits"


LLAMA_FILE = "catalog/llama-3.1-70b-instruct.yaml"


def test_the_comment_in_docs_review_md_is_what_llmgw_review_prints(tmp_path):
    from review_repos import ROOT, docs_example

    docs_example(tmp_path)
    done = llmgw("review", "main", "scale-70b", "--repo", "settings", "--fleet", "fleet.json", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    text = (ROOT / "docs" / "review.md").read_text()
    start = text.index("````markdown\n") + len("````markdown\n")
    assert text[start:text.index("````\n", start)] == done.stdout
    assert text.endswith(done.stdout)

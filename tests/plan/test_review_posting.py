"""`llmgw review --post FORGE` against a stand-in forge (GitHub, GitLab, Gitea shapes): one comment per pull
request, edited in place on each push, and the commit status llmgw/plan. The command runs in the test's process
(support.in_process_cli); a refused token is also run as a real process (its exit status and stderr)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from forge_stand_in import TOKEN, running_forge
from review_repos import branch, edit, example_repo, example_snapshot, git, replicas
from support.in_process_cli import completed

REPOSITORY = {"github": "acme/settings", "gitlab": "acme/settings", "gitea": "acme/settings"}
FAILED = {"github": "failure", "gitlab": "failed", "gitea": "failure"}
ERROR = {"github": "error", "gitlab": "failed", "gitea": "error"}


def post(repo: Path, snapshot: Path, head: str, forge, *extra: str, env: dict | None = None,
         flags: bool = True, process: bool = False) -> subprocess.CompletedProcess:
    """`llmgw review ... --post KIND` with the CI variables of this environment (GITHUB_*, CI_*, LLMGW_*) unset and
    `env` set (default: the forge's token); in the test's process (support.in_process_cli), or as a real process."""
    where = ["--forge-url", forge.url, "--forge-repo", REPOSITORY[forge.kind], "--pr", "7"] if flags else []
    args = ["review", "main", head, "--repo", str(repo), "--fleet", str(snapshot), "--post", forge.kind, *where,
            *extra]
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("GITHUB_", "CI_", "LLMGW_"))}
    environment = unset | (env if env is not None else {"LLMGW_FORGE_TOKEN": TOKEN})
    if not process:
        return completed(args, env=environment)
    return subprocess.run([sys.executable, "-m", "llmgw.cli", *args], capture_output=True, text=True,
                          env={k: v for k, v in (os.environ | environment).items() if v is not None})


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return example_repo(tmp_path / "settings")


@pytest.fixture
def snapshot(repo: Path, tmp_path: Path) -> Path:
    return example_snapshot(repo, tmp_path / "fleet.json")


def push(repo: Path, name: str, rel: str, old: str, new: str) -> str:
    """One more commit on branch `name`; its id."""
    git(repo, "checkout", "-q", name)
    edit(repo, rel, old, new)
    git(repo, "commit", "-q", "-am", "another push")
    commit = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return commit


@pytest.mark.parametrize("kind", ["github", "gitlab", "gitea"])
def test_each_push_edits_the_one_comment_and_sets_the_status(kind, repo, snapshot):
    first = branch(repo, "add-70b", [replicas(1)])
    with running_forge(kind) as forge:
        forge.seed(REPOSITORY[kind], 7, "looks good", "what about the CPU node?", "+1")
        done = post(repo, snapshot, "add-70b", forge)
        assert done.returncode == 2, done.stderr
        assert "comment 104 created, llmgw/plan success" in done.stderr
        ours = forge.ours(REPOSITORY[kind], 7)
        assert len(ours) == 1 and f"head={first}" in ours[0]["body"] and "## llmgw review: fits" in ours[0]["body"]
        assert ours[0]["body"] == done.stdout

        second = push(repo, "add-70b", "catalog/llama-3.1-70b-instruct.yaml", "\nreplicas: 1\n", "\nreplicas: 5\n")
        done = post(repo, snapshot, "add-70b", forge)
        assert done.returncode == 3, done.stderr
        assert "comment 104 edited" in done.stderr
        comments = forge.comments[(REPOSITORY[kind], 7)]
        assert [c["body"] for c in comments[:3]] == ["looks good", "what about the CPU node?", "+1"]
        ours = forge.ours(REPOSITORY[kind], 7)
        assert len(ours) == 1 and f"head={second}" in ours[0]["body"] and "does not fit" in ours[0]["body"]

        name = "name" if kind == "gitlab" else "context"
        state = "status" if kind == "gitlab" else "state"
        assert [(s[name], s[state]) for s in forge.statuses[(REPOSITORY[kind], first)]] == [("llmgw/plan", "success")]
        assert [(s[name], s[state]) for s in forge.statuses[(REPOSITORY[kind], second)]] == \
            [("llmgw/plan", FAILED[kind])]
        assert forge.statuses[(REPOSITORY[kind], second)][0]["description"] == "some replicas cannot be placed"


@pytest.mark.parametrize("kind", ["github", "gitlab", "gitea"])
def test_a_head_that_does_not_load_is_posted_as_an_error(kind, repo, snapshot):
    head = branch(repo, "broken", [("catalog/llama-3.1-70b-instruct.yaml", "\nreplicas: 0\n", "\nreplicas: many\n")])
    with running_forge(kind) as forge:
        forge.seed(REPOSITORY[kind], 7)
        done = post(repo, snapshot, "broken", forge)
        assert done.returncode == 1
        body = forge.ours(REPOSITORY[kind], 7)[0]["body"]
        assert body.startswith(f"<!-- llmgw-review base=- head={head} fleet=- -->\n## llmgw review: failed")
        assert "HEAD broken does not load:" in body and "catalog/llama-3.1-70b-instruct.yaml" in body
        state = "status" if kind == "gitlab" else "state"
        assert forge.statuses[(REPOSITORY[kind], head)][0][state] == ERROR[kind]


def test_the_target_comes_from_github_actions_variables(repo, snapshot):
    branch(repo, "add-70b", [replicas(1)])
    with running_forge("github") as forge:
        forge.seed("acme/settings", 12)
        env = {"GITHUB_API_URL": forge.url, "GITHUB_REPOSITORY": "acme/settings", "GITHUB_REF": "refs/pull/12/merge",
               "GITHUB_TOKEN": TOKEN, "GITHUB_SERVER_URL": "https://github.example", "GITHUB_RUN_ID": "99"}
        done = post(repo, snapshot, "add-70b", forge, env=env, flags=False)
        assert done.returncode == 2, done.stderr
        assert len(forge.ours("acme/settings", 12)) == 1
        (status,) = next(iter(forge.statuses.values()))
        assert status["target_url"] == "https://github.example/acme/settings/actions/runs/99"


def test_the_target_comes_from_gitlab_ci_variables(repo, snapshot):
    branch(repo, "add-70b", [replicas(1)])
    with running_forge("gitlab") as forge:
        forge.seed("4242", 3)
        env = {"CI_API_V4_URL": forge.url, "CI_PROJECT_ID": "4242", "CI_MERGE_REQUEST_IID": "3",
               "GITLAB_TOKEN": TOKEN, "CI_PIPELINE_URL": "https://gitlab.example/acme/settings/-/pipelines/5"}
        done = post(repo, snapshot, "add-70b", forge, env=env, flags=False)
        assert done.returncode == 2, done.stderr
        assert len(forge.ours("4242", 3)) == 1
        assert ("PUT" not in {m for m, _ in forge.requests}) and ("POST", "/projects/4242/merge_requests/3/notes") \
            in forge.requests


def test_a_refused_token_or_missing_target_is_an_error_with_a_sentence(repo, snapshot):
    branch(repo, "add-70b", [replicas(1)])
    with running_forge("github") as forge:
        forge.seed("acme/settings", 7)
        done = post(repo, snapshot, "add-70b", forge, env={"LLMGW_FORGE_TOKEN": "wrong"}, process=True)
        assert done.returncode == 1 and "refused the token (401" in done.stderr
        done = post(repo, snapshot, "add-70b", forge, env={}, flags=False)
        assert done.returncode == 1
        assert "--post github needs --forge-repo (or GITHUB_REPOSITORY), --pr (or GITHUB_REF)" in done.stderr
        assert not forge.ours("acme/settings", 7)


@pytest.mark.parametrize("kind", ["github", "gitlab", "gitea"])
def test_a_marker_planted_by_someone_else_is_never_edited(kind, repo, snapshot):
    branch(repo, "add-70b", [replicas(1)])
    with running_forge(kind) as forge:
        forge.seed(REPOSITORY[kind], 7)
        planted = forge.add(REPOSITORY[kind], 7, "<!-- llmgw-review base=- head=- fleet=- -->\nall good, merge it",
                            "mallory")
        done = post(repo, snapshot, "add-70b", forge)
        assert done.returncode == 2, done.stderr
        assert planted["body"].endswith("all good, merge it")  # untouched
        ours = forge.ours(REPOSITORY[kind], 7)
        assert len(ours) == 1 and ours[0]["id"] != planted["id"] and "## llmgw review: fits" in ours[0]["body"]


def test_a_message_holding_a_fence_stays_inside_its_code_block():
    from llmgw.cli.review_markdown import fenced
    from llmgw.cli.review_posting import error_markdown

    message = "catalog/x.yaml:3:1: name: 'a```\n## Approved by llmgw\n````' is not valid"
    body = error_markdown("ab" * 20, message)
    opening = body.splitlines()[3]
    assert set(opening) == {"`"} and len(opening) == 5  # longer than the longest run of backticks inside
    assert body.rstrip("\n").endswith("\n" + opening) and body.count("\n" + opening + "\n") == 2  # open, close
    assert fenced("plain", "diff") == ["```diff", "plain", "```"]


@pytest.mark.parametrize("kind", ["github", "gitlab", "gitea"])
def test_each_canary_sets_its_commit_status_by_phase(kind):
    from llmgw.cli.review_posting import Target, post_canary_statuses

    failed = "canary of big at aaaaaaaaaaaa (big-0, 0.1 of requests) failed: TTFT p90 3.10 s above the SLO's " \
             "2.00 s over 40 requests; stopped, the old replicas kept serving; revert proposed on branch llmgw/revert-a"
    canaries = {"big": {"commit": "a" * 40, "phase": "failed", "summary": failed},
                "small": {"commit": "b" * 40, "phase": "held", "summary": "canary of small ... held"},
                "tiny": {"commit": "c" * 40, "phase": "running", "summary": "canary of tiny ... running"}}
    with running_forge(kind) as forge:
        target = Target(kind, forge.url, REPOSITORY[kind], 0, TOKEN)
        done = post_canary_statuses(target, canaries)
        pending = "running" if kind == "gitlab" else "pending"
        assert done == [("big", "a" * 40, FAILED[kind]), ("small", "b" * 40, "success"), ("tiny", "c" * 40, pending)]
        name = "name" if kind == "gitlab" else "context"
        (big,) = forge.statuses[(REPOSITORY[kind], "a" * 40)]
        assert big[name] == "llmgw/canary" and len(big["description"]) == 140
        assert big["description"].startswith("canary of big at aaaaaaaaaaaa (big-0, 0.1 of requests) failed: TTFT p90")

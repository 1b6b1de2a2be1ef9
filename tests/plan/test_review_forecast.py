"""The forecast in `llmgw review` (docs/review.md, "The forecast"), run on real git repositories with a fleet
snapshot that holds the last days' load (`review_repos.example_load`). The commands run in the test's process
(support.in_process_cli); a review without a forecast is also refused by a real process (exit status, stderr)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from forge_stand_in import TOKEN, running_forge
from review_repos import (
    branch, docs_example, example_fleet, example_load, example_repo, example_snapshot, git, write_snapshot,
)
from support.in_process_cli import completed

from llmgw.plan.forecasting import ModelLoad, RecordedLoad, Traffic
from llmgw.settings import load_commit

GEMMA = "catalog/gemma-3-270m.yaml"


def llmgw(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`llmgw ARGS` in the test's process (support.in_process_cli), `env` set over the environment."""
    return completed(list(args), env=env)


def llmgw_process(*args: str) -> subprocess.CompletedProcess:
    """`python -m llmgw.cli ARGS` as a real process."""
    return subprocess.run([sys.executable, "-m", "llmgw.cli", *args], capture_output=True, text=True)


def review(repo: Path, snapshot: Path, head: str, *extra: str) -> subprocess.CompletedProcess:
    return llmgw("review", "main", head, "--repo", str(repo), "--fleet", str(snapshot), *extra)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return example_repo(tmp_path / "settings")


def test_a_second_gemma_replica_is_forecast_from_its_measured_speed_and_traffic(repo, tmp_path):
    snapshot = example_snapshot(repo, tmp_path / "fleet.json", example_load())
    branch(repo, "two-gemma", [(GEMMA, "\nreplicas: 1\n", "\nreplicas: 2\n")])
    done = review(repo, snapshot, "two-gemma", "--json")
    assert done.returncode == 2, done.stderr
    forecast = json.loads(done.stdout)["forecast"]
    assert forecast["window_seconds"] == 3 * 86400 and forecast["until"] == "2026-12-01T02:00:00Z"
    (gemma,) = forecast["models"]
    # 10,800 requests of 288.9 prompt and 97.2 completion tokens; busiest hour 480 requests; 250 / 38 tokens/s
    p, c, lam = 3_120_000 / 10_800, 1_050_000 / 10_800, 480 / 3600
    s = p / 250 + c / 38
    assert gemma["model"] == "gemma-3-270m" and (gemma["replicas_before"], gemma["replicas_after"]) == (1, 2)
    assert gemma["capacity_before"] == pytest.approx(c / s) and gemma["capacity_after"] == pytest.approx(2 * c / s)
    assert gemma["expected_tokens_per_second"] == pytest.approx(lam * c)
    assert gemma["utilisation_after"] == pytest.approx(lam * s / 2)
    assert gemma["ttft_p90_before"] == 2.9
    assert gemma["ttft_p90_after"] == pytest.approx(2.9 * (1 - lam * s) / (1 - lam * s / 2))
    quotas = {q["project"]: q for q in gemma["quotas"]}
    assert sorted(quotas) == ["assistants", "ci", "demo"]
    assert quotas["ci"]["tokens_per_day"] == pytest.approx(180_000 / 3) and quotas["ci"]["tokens_per_day_limit"] == 2_000_000
    markdown = review(repo, snapshot, "two-gemma").stdout
    assert "### Forecast" in markdown and "over the last 3 days up to 2026-12-01T02:00:00Z" in markdown
    assert "| `gemma-3-270m` | 1 → 2 | 13 of 52.4 (capacity now 26.2) | 2.90 s → 1.95 s | 0 → 0 |" in markdown
    assert "| `ci` | `gemma-3-270m` | 0.889 of 120 (1%) | 133 (no limit) | 60,000 of 2,000,000 (3%) |" in markdown


def test_taking_gemma_away_is_forecast_as_overloaded(repo, tmp_path):
    snapshot = example_snapshot(repo, tmp_path / "fleet.json", example_load())
    branch(repo, "no-gemma", [(GEMMA, "\nreplicas: 1\n", "\nreplicas: 0\n")])
    done = review(repo, snapshot, "no-gemma")
    assert done.returncode == 2, done.stderr
    assert "| `gemma-3-270m` | 1 → 0 | 0 of 0 (capacity now 26.2) | 2.90 s → overloaded | 0 → 0 |" in done.stdout
    assert ("- **`gemma-3-270m` is overloaded after the change**: its busiest hour asks 13 completion tokens/s, "
            "its 0 replicas make at most 0.") in done.stdout


def test_a_snapshot_without_load_forecasts_gpu_hours_only(repo, tmp_path):
    snapshot = example_snapshot(repo, tmp_path / "fleet.json")
    branch(repo, "add-70b", [("catalog/llama-3.1-70b-instruct.yaml", "\nreplicas: 0\n", "\nreplicas: 2\n")])
    done = review(repo, snapshot, "add-70b")
    assert done.returncode == 2, done.stderr
    assert "The fleet snapshot recorded no load (`llmgw fleet snapshot` adds it): GPU-hours only." in done.stdout
    assert "| `llama-3.1-70b-instruct` | 0 → 2 | ? | ? → ? | 0 → 96 |" in done.stdout
    assert ("- `llama-3.1-70b-instruct`: not forecast: no traffic recorded in the window; no measured speed (run "
            "`llmgw bench` on a replica of it).") in done.stdout


def later_load() -> RecordedLoad:
    """An hour after the docs example's change ran: gemma's traffic as before, a little slower than forecast."""
    return RecordedLoad(window_seconds=3600.0, until="2026-12-02T03:00:00Z",
                        traffic=(Traffic("gemma-3-270m", "demo", 400, 120_000, 39_000),
                                 Traffic("gemma-3-270m", "ci", 80, 8_000, 4_000)),
                        models={"gemma-3-270m": ModelLoad("gemma-3-270m", 480, 2.1, 480)})


def test_the_forecast_is_checked_after_the_change_and_posted_as_a_comment_of_its_own(tmp_path):
    repo, snapshot = docs_example(tmp_path)
    review_json = tmp_path / "review.json"
    assert review(repo, snapshot, "scale-70b", "--json-file", str(review_json)).returncode == 3
    later = write_snapshot(tmp_path / "later.json", example_fleet(load_commit(repo, "main")), None,
                           load=later_load())
    done = llmgw("forecast-check", str(review_json), "--fleet", str(later))
    assert done.returncode == 0, done.stderr
    head = git(repo, "rev-parse", "scale-70b")
    assert done.stdout.startswith(f"<!-- llmgw-forecast-check head={head} -->\n## llmgw forecast check of")
    assert "over the 1 hour up to 2026-12-02T03:00:00Z" in done.stdout
    # forecast 0.133 requests/s x 97.2 tokens = 13 tokens/s; measured 480/h x 89.6 tokens = 11.9; TTFT 1.95 s vs 2.1 s
    assert ("| `gemma-3-270m` | 0.133, 0.133 (+0%) | 13, 11.9 (-8%) | 1.95 s, 2.10 s (+8%) |") in done.stdout
    assert "| `llama-3.1-70b-instruct` | 0, ? (?) | ?, ? (?) | ?, ? (?) |" in done.stdout
    checks = json.loads(llmgw("forecast-check", str(review_json), "--fleet", str(later), "--json").stdout)
    assert [c["model"] for c in checks] == ["gemma-3-270m", "llama-3.1-70b-instruct"]
    assert checks[0]["tokens_error"] == pytest.approx((480 / 3600 * 43_000 / 480) / (480 / 3600 * 1_050_000 / 10_800) - 1)

    with running_forge("github") as forge:
        forge.seed("acme/settings", 7, "looks good")
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("GITHUB_", "CI_", "LLMGW_"))}
        env["LLMGW_FORGE_TOKEN"] = TOKEN
        where = ("--post", "github", "--forge-url", forge.url, "--forge-repo", "acme/settings", "--pr", "7")
        posted = llmgw("forecast-check", str(review_json), "--fleet", str(later), *where, env=env)
        assert posted.returncode == 0 and "comment 102 created" in posted.stderr, posted.stderr
        again = llmgw("forecast-check", str(review_json), "--fleet", str(later), *where, env=env)
        assert "comment 102 edited" in again.stderr, again.stderr
        bodies = [c["body"] for c in forge.comments[("acme/settings", 7)]]
        assert bodies == ["looks good", done.stdout] and not forge.statuses


def test_a_review_without_a_forecast_or_a_snapshot_without_load_is_refused(tmp_path, repo):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"version": 1, "verdict": "fits"}))
    done = llmgw_process("forecast-check", str(old), "--fleet", str(old))
    assert done.returncode == 1 and f"{old} holds no forecast" in done.stderr and done.stdout == ""
    review_json = tmp_path / "review.json"
    snapshot = example_snapshot(repo, tmp_path / "fleet.json")
    branch(repo, "two-gemma", [(GEMMA, "\nreplicas: 1\n", "\nreplicas: 2\n")])
    review(repo, snapshot, "two-gemma", "--json-file", str(review_json))
    done = llmgw("forecast-check", str(review_json), "--fleet", str(snapshot))
    assert done.returncode == 1 and "recorded no load" in done.stderr and "Traceback" not in done.stderr

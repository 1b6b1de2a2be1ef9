"""The forecast in `llmgw review` (docs/review.md, "The forecast"), run as a real process on real git repositories
with a fleet snapshot that holds the last days' load (`review_repos.example_load`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from review_repos import branch, example_load, example_repo, example_snapshot

GEMMA = "catalog/gemma-3-270m.yaml"


def review(repo: Path, snapshot: Path, head: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmgw.cli", "review", "main", head, "--repo", str(repo), "--fleet",
                           str(snapshot), *extra], capture_output=True, text=True)


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

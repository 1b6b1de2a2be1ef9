"""A running control plane checks a reviewed change's forecast: `llmgw review --json` (real process) forecasts
gemma's change from the live fleet's load; `llmgw apply --review` of a change that converges at once (stand-in agents
start nothing) sets `reconcile.forecast_check_after: 2s`; 2 s after it converged the plane reads the usage records
written since (`recorded_load`, `check_forecast`) and an audit commit carries each model's error in its message and in
status.yaml's `forecast_check`. The timing on MockClock: test_forecast_audit_loop.py."""

from __future__ import annotations

import functools
import json
import time

import pytest
import trio
import yaml

from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import Listener, load_commit
from llmgw.store import UsageRecord

from .conftest import git
from .test_in_process_fleet import wait_for
from .test_review_against_a_running_plane import (
    cpu_register, example_repository, h100_register, llmgw, pull_request, stand_in_agent,
)


def audit_entries(repo) -> list[tuple[str, str]]:
    """(commit, message) of each audit commit, newest first."""
    out = git("log", "--format=%H%x00%B%x01", "refs/llmgw/audit", cwd=repo)
    return [tuple(entry.strip("\n").split("\0", 1)) for entry in out.split("\x01") if entry.strip()]


async def test_the_plane_audits_the_error_of_a_reviewed_forecast_after_its_window(tmp_path):
    repo, clone = example_repository(tmp_path)
    pull_request(clone, "two-gemma", "catalog/gemma-3-270m.yaml", "\nreplicas: 1\n", "\nreplicas: 2\n")
    pull_request(clone, "check-soon", "llmgw.yaml", "  action_timeout: 10m ",
                 "  forecast_check_after: 2s\n  action_timeout: 10m ")

    base = load_commit(repo, "main")
    any_port = Listener("127.0.0.1", 0)
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", gateway_listener=any_port,
                                       admin_listener=any_port, agents_listener=any_port))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        await nursery.start(functools.partial(stand_in_agent, acknowledge=True), plane, h100_register())
        await nursery.start(functools.partial(stand_in_agent, acknowledge=True), plane, cpu_register(base, base.commit))
        await wait_for(lambda: len(plane.registry.fleet().nodes) == 2, 20, "two nodes")
        now = time.time()
        for i in range(4):  # the traffic the review forecasts from: 4 requests of ci in the last hour
            await trio.to_thread.run_sync(plane.store.record_usage, UsageRecord(
                "ci", "gemma-3-270m", now - 60 * (i + 1), replica="gemma-3-270m-0", prompt_tokens=100,
                completion_tokens=20, ttft_seconds=0.1 * (i + 1)))

        code, out, err = await llmgw(plane, "review", "main", "two-gemma", "--json", cwd=clone)
        assert code == 2, err
        gemma_forecast = json.loads(out)["forecast"]["models"]
        code, out, err = await llmgw(plane, "review", "main", "check-soon", "--json", cwd=clone)
        assert code == 2, err  # a change (llmgw.yaml), no replica moves
        review = json.loads(out)
        # the stand-in agents start nothing, so the change applied is one that converges at once (a setting); the
        # forecast it carries is two-gemma's, as the review of a change to gemma wrote it
        review["forecast"] = {**(review.get("forecast") or {}), "models": gemma_forecast}
        (tmp_path / "review.json").write_text(json.dumps(review))
        git("push", "-q", str(repo), "check-soon:main", cwd=clone)
        head = git("rev-parse", "check-soon", cwd=clone).strip()

        code, out, err = await llmgw(plane, "apply", "--review", str(tmp_path / "review.json"), "--timeout", "30",
                                     cwd=clone)
        assert code == 0, (out[:3000], err)
        await wait_for(lambda: plane.loop.state.forecast_audit is not None, 10, "the window to start")
        converged = plane.loop.state.forecast_audit.converged_at_unix
        for ttft in (0.2, 0.3, 0.5):  # what gemma's replicas did after the change
            await trio.to_thread.run_sync(plane.store.record_usage, UsageRecord(
                "ci", "gemma-3-270m", time.time(), replica="gemma-3-270m-0", prompt_tokens=50,
                completion_tokens=40, ttft_seconds=ttft))

        def checked() -> list[str]:
            return [m for _, m in audit_entries(repo) if "forecast of reviewed" in m]

        await wait_for(checked, 20, "the forecast's audit entry")
        took = time.time() - converged
        assert 2.0 <= took < 20, took
        (message,) = checked()
        lines = message.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith(f"- forecast of reviewed {head[:12]} checked"))
        # the fleet has no measured speed of gemma (no `llmgw bench`): the review forecast its traffic only, so the
        # errors of tokens/s and TTFT p90 are unknown and the traffic's move is what the entry can say
        commit = next(c for c, m in audit_entries(repo) if "forecast of reviewed" in m)
        status = yaml.safe_load(git("show", f"{commit}:status.yaml", cwd=repo))
        check = status["forecast_check"]
        assert check["commit"] == head and check["state"] == "measured" and 2.0 <= check["window_seconds"] < 20
        (model,) = check["models"]
        assert model["model"] == "gemma-3-270m" and model["requests"] == 3  # those before the change left out
        assert model["ttft_p90_measured"] == 0.5 and model["ttft_p90_forecast"] is None
        assert model["rate_measured"] == 3 / check["window_seconds"]
        assert model["rate_error"] == pytest.approx(model["rate_measured"] / model["rate_forecast"] - 1)
        assert model["tokens_measured"] == pytest.approx(40 * model["rate_measured"]) and model["tokens_error"] is None
        assert lines[at + 1] == (
            f"  - gemma-3-270m: completion tokens/s forecast unknown, measured {model['tokens_measured']:.3g} (error "
            f"unknown); TTFT p90 forecast unknown, measured 0.5 s (error unknown); requests/s forecast "
            f"{model['rate_forecast']:.3g}, measured {model['rate_measured']:.3g} (traffic moved "
            f"{model['rate_error']:+.0%}; 3 requests)")
        nursery.cancel_scope.cancel()

"""GPU-hours on the stand-in GPU fleet: a control plane with an in-process agent whose NVML is the H200 stand-in
serves "big" (one H200 per replica, llama-server stand-in) and "tiny" (0.1 CPU core); two projects send requests
through the gateway one after another, and `llmgw usage --gpu-hours` and GET /api/v1/usage/gpu-hours give each
project its requests' time on the replicas (one GPU for "big", 0.1 core for "tiny") priced at llmgw.yaml's
`gpu_hour_cost` (h200-141g 4.0, cpu 0.5), from the usage records the gateway wrote."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
import trio
from click.testing import CliRunner

from llmgw.agent import run_agent
from llmgw.cli.main import cli
from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import init_repository

from .conftest import stand_in_agent, write_seed
from .test_fleet_readings import GPU_MODEL
from .test_in_process_fleet import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent" / "discovery"))
from fake_nvml import FakeNvml  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from settings_seed import projects_yaml  # noqa: E402

PRICES = "prices:\n  currency: EUR\n  gpu_hour_cost:\n    h200-141g: 4.0\n    cpu: 0.5\n"
SENT = [("demo", "big"), ("research", "big"), ("demo", "big"), ("demo", "tiny"), ("research", "tiny")]


def _repo(tmp_path: Path, sha: str) -> Path:
    seed = write_seed(tmp_path / "seed", sha)
    (seed / "catalog" / "big.yaml").write_text(GPU_MODEL.format(sha=sha))
    (seed / "projects.yaml").write_text(projects_yaml({"demo": {"models": ["tiny", "big"]},
                                                       "research": {"models": ["tiny", "big"]}}))
    (seed / "llmgw.yaml").write_text((seed / "llmgw.yaml").read_text() + PRICES)
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    return repo


def _expected(records) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(GPU-hours, core-hours, cost) per (project, model), from records of requests that never overlapped."""
    out: dict[tuple[str, str], tuple[float, float, float]] = {}
    for record in records:
        hours = record.duration_seconds / 3600
        gpu, cores = (hours, 0.0) if record.model == "big" else (0.0, 0.1 * hours)
        old = out.get((record.project, record.model), (0.0, 0.0, 0.0))
        out[(record.project, record.model)] = (old[0] + gpu, old[1] + cores, old[2] + 4.0 * gpu + 0.5 * cores)
    return out


async def test_each_project_is_given_the_gpu_hours_and_core_hours_of_its_requests_priced_in_usage(
        tmp_path, weights_mirror, fake_engine):
    mirror, sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(_repo(tmp_path, sha)), state_dir=tmp_path / "state"))
    agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine)
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        await nursery.start(lambda task_status: run_agent(agent, plane.local_connector(), nvml=FakeNvml.h200(),
                                                          task_status=task_status))
        await wait_for(lambda: all((plane.status()["replicas"].get(r) or {}).get("state") == "ready"
                                   for r in ("big-0", "tiny-0")), 30, "big-0 and tiny-0 ready", plane.status)
        keys = {project: plane.store.create_api_key(project)[1] for project in ("demo", "research")}
        async with httpx.AsyncClient(timeout=10) as client:
            for project, model in SENT:  # one after another: no two requests share a replica's time
                reply = await client.post(f"{plane.gateway_url}/v1/chat/completions", json={
                    "model": model, "messages": [{"role": "user", "content": "hi"}]},
                    headers={"Authorization": f"Bearer {keys[project]}"})
                assert reply.status_code == 200, reply.text
            await wait_for(lambda: len(plane.store.recent_usage(limit=100)) == len(SENT), 10,
                           "the usage records in the store")
            answer = await client.get(f"{plane.admin_url}/api/v1/usage/gpu-hours", params={"since": "0"},
                                      headers={"Authorization": f"Bearer {plane.admin_token}"})
        records = plane.store.recent_usage(limit=100)
        nursery.cancel_scope.cancel()
    assert all(r.duration_seconds > 0 and r.replica for r in records)
    expected = _expected(records)
    assert answer.status_code == 200, answer.text
    document = answer.json()
    assert (document["currency"], document["since"], document["records"], document["truncated"]) == (
        "EUR", "1970-01-01T00:00:00Z", len(SENT), False)
    rows = {(r["project"], r["model"]): r for r in document["rows"]}
    assert set(rows) == set(expected)
    for key, (gpu, cores, cost) in expected.items():
        # a request's start is its end time (unix seconds, ~1.8e9, kept to about 2e-7 s) less its duration
        # (milliseconds here): the shares carry that rounding
        assert rows[key]["gpu_hours"] == pytest.approx(gpu, rel=1e-3)
        assert rows[key]["core_hours"] == pytest.approx(cores, rel=1e-3)
        assert rows[key]["cost"] == pytest.approx(cost, rel=1e-3)
    assert rows[("demo", "big")]["requests"] == 2

    common = ["--state", str(tmp_path / "state"), "--repo", str(tmp_path / "settings.git")]
    printed = CliRunner().invoke(cli, ["usage", "--gpu-hours", "--project", "research", "--json", *common],
                                 catch_exceptions=False)
    assert printed.exit_code == 0, printed.output
    assert {(r["project"], r["model"]) for r in json.loads(printed.output)["rows"]} == {
        ("research", "big"), ("research", "tiny")}
    table = CliRunner().invoke(cli, ["usage", "--gpu-hours", *common], catch_exceptions=False)
    assert table.exit_code == 0, table.output
    assert "GPU-hours" in table.output and "cost (EUR)" in table.output
    line = next(line for line in table.output.splitlines() if "demo" in line and "big" in line)
    assert f"{expected[('demo', 'big')][0]:.4f}" in line
    missing = CliRunner().invoke(cli, ["usage", "--gpu-hours", "--state", str(tmp_path / "state")])
    assert missing.exit_code == 1 and "give one with --repo PATH" in str(missing.exception)

"""A control plane with an in-process agent whose NVML is the stand-in built from the H200 captures, serving
replica tiny-0 of the test settings: what the observability tests scrape."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import init_repository

from .conftest import stand_in_agent, write_seed
from .test_in_process_fleet import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent" / "discovery"))
from fake_nvml import FakeNvml  # noqa: E402


@asynccontextmanager
async def observed_fleet(tmp_path: Path, weights_mirror, fake_engine: Path,
                         nvml: FakeNvml | None = None, otlp_endpoint: str | None = None,
                         ) -> AsyncIterator[ControlPlane]:
    """Run a ControlPlane and agent "n1" (heartbeats every 0.2 s, readings every 0.5 s, one stand-in H200 unless
    `nvml` is given) until tiny-0 is ready and n1's readings arrived; yield the plane; cancel both on exit.
    `otlp_endpoint`: where the plane sends its traces (None: off)."""
    mirror, sha = weights_mirror
    seed = write_seed(tmp_path / "seed", sha)
    default = seed / "agents" / "default.yaml"
    default.write_text(default.read_text() + "telemetry_interval: 500ms\n")
    settings_repo = tmp_path / "settings.git"
    init_repository(settings_repo, seed)
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state",
                                       otlp_endpoint=otlp_endpoint))
    agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine)
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        await nursery.start(lambda task_status: run_agent(agent, plane.local_connector(),
                                                          nvml=nvml or FakeNvml.h200(), task_status=task_status))
        await wait_for(lambda: (plane.status()["replicas"].get("tiny-0") or {}).get("state") == "ready", 30,
                       "tiny-0 ready", lambda: plane.status())
        await wait_for(lambda: plane.snapshot().fleet.get("n1").readings is not None, 10, "n1 readings")
        yield plane
        nursery.cancel_scope.cancel()


async def chat_once(plane: ControlPlane, client: httpx.AsyncClient) -> dict:
    """One chat completion of "tiny" through the plane's gateway with a new key of project "demo"; its answer."""
    _record, api_key = plane.store.create_api_key("demo")
    reply = await client.post(f"{plane.gateway_url}/v1/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                              json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 200, reply.text
    return reply.json()

"""A model whose engine arguments change is rolled: the new shard is ready before the old one stops, so the
gateway always has a route to it."""

from __future__ import annotations

import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane

from .conftest import stand_in_agent
from .test_in_process_fleet import commit_directly, replica_states, wait_for


async def test_a_changed_model_rolls_without_a_moment_unserved(tmp_path, settings_repo, weights_mirror, fake_engine):
    mirror, sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine)
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        await nursery.start(run_agent, agent, plane.local_connector())
        await wait_for(lambda: replica_states(plane).get("tiny-0") == "ready" and plane.table.models["tiny"].replicas,
                       30, "tiny-0 ready")
        old_url = plane.table.models["tiny"].replicas[0].base_url

        unserved = []  # (time, the shards' states then) of each moment the gateway had no route to tiny

        async def watch_routes() -> None:
            while True:
                if not plane.table.models["tiny"].replicas:
                    shards = plane.status()["nodes"]["n1"]["shards"]
                    unserved.append((trio.current_time(), {sid: s["state"] for sid, s in shards.items()}))
                await trio.sleep(0.01)

        nursery.start_soon(watch_routes)
        text = (b"name: tiny\nengine: llama.cpp\nengine_version: b11434\nweights:\n"
                b"  - source: https://example.invalid/tiny/tiny.gguf\n    sha256: " + sha.encode() +
                b"\nreplicas: 1\nresources:\n  cpu_cores: 0.1\n  memory: 64Mi\ncontext_size: 1024\n")
        await trio.to_thread.run_sync(commit_directly, settings_repo, "catalog/tiny.yaml", text, "bigger context")
        plane.wake_watcher()

        def rolled():
            shards = plane.status()["nodes"]["n1"]["shards"]
            live = {sid: s for sid, s in shards.items() if s["replica"] == "tiny-0" and s["state"] != "stopped"}
            return len(live) == 1 and next(iter(live)) != "tiny-0/0" and all(
                s["state"] == "ready" for s in live.values()) and plane.snapshot().last_pass.converged

        await wait_for(rolled, 30, "the roll to finish", plane.status)
        assert plane.table.models["tiny"].replicas[0].base_url != old_url
        assert unserved == []
        nursery.cancel_scope.cancel()

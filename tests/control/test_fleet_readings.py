"""The fleet state keeps every heartbeat's readings: a card another process holds is out of placement only while
it holds it, `ignore_gpus` hides a card, and the status shows readings with their age. A real control plane and an
in-process agent whose NVML is the stand-in built from the H200 captures."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.readings import NodeReadings
from llmgw.settings import init_repository

from .conftest import stand_in_agent, write_seed
from .test_in_process_fleet import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent" / "discovery"))
from fake_nvml import FakeNvml  # noqa: E402

GPU_MODEL = """\
name: big
engine: llama.cpp
engine_version: b11434
weights:
  - source: https://example.invalid/big/big.gguf
    sha256: {sha}
replicas: 1
resources:
  gpus: 1
  gpu_class: h200-141g
  cpu_cores: 0.1
  memory: 64Mi
context_size: 512
"""


def gpu_repo(tmp_path: Path, sha: str, agents_extra: str = "", tiny_replicas: int = 0) -> Path:
    """A settings repository under `tmp_path` serving "big" (one H200) and `tiny_replicas` of "tiny", with
    `agents_extra` (YAML lines) added to agents/default.yaml."""
    seed = write_seed(tmp_path / "seed", sha, replicas=tiny_replicas)
    (seed / "catalog" / "big.yaml").write_text(GPU_MODEL.format(sha=sha))
    (seed / "projects.yaml").write_text((seed / "projects.yaml").read_text().replace("[tiny]", "[tiny, big]"))
    if agents_extra:
        default = seed / "agents" / "default.yaml"
        default.write_text(default.read_text() + agents_extra)
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    return repo


def unplaced_reasons(plane: ControlPlane) -> str:
    plan = plane.snapshot().last_plan
    return "; ".join(str(u) for u in plan.unplaced) if plan else ""


async def test_a_card_held_by_another_process_comes_back_within_two_heartbeats_of_it_exiting(
    tmp_path, weights_mirror, fake_engine,
):
    mirror, sha = weights_mirror
    nvml = FakeNvml.h200(processes=[{"pid": 4242, "used": 2 << 30}])
    plane = ControlPlane(ControlConfig(repo=str(gpu_repo(tmp_path, sha)), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        agent = stand_in_agent("gpu1", tmp_path / "agent", mirror, fake_engine)
        await nursery.start(lambda task_status: run_agent(agent, plane.local_connector(), nvml=nvml,
                                                          task_status=task_status))
        await wait_for(lambda: "1 with foreign processes" in unplaced_reasons(plane), 20,
                       "big-0 unplaced: the card is held", lambda: plane.status())
        assert plane.snapshot().fleet.get("gpu1").state.gpus[0].foreign_processes

        nvml.cards[0]["processes"] = []  # the other process exits; the agent stays connected
        beats: set[float] = set()  # heartbeats that arrived since, told apart by their arrival time
        with trio.fail_after(20):
            while True:
                record = plane.snapshot().fleet.get("gpu1")
                if not record.state.gpus[0].foreign_processes:
                    break
                beats.add(record.last_seen)
                await trio.sleep(0.01)
        assert len(beats) <= 2, f"the card came back after {len(beats)} heartbeats"
        await wait_for(lambda: (plane.status()["replicas"].get("big-0") or {}).get("node") == "gpu1", 20,
                       "big-0 placed on gpu1", lambda: plane.status())
        assert plane.registry.get("gpu1").connected  # no reconnect was needed
        nursery.cancel_scope.cancel()


async def test_ignore_gpus_hides_a_card_from_placement(tmp_path, weights_mirror, fake_engine):
    mirror, sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(gpu_repo(tmp_path, sha, "ignore_gpus: ['0']\n")),
                                       state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        agent = stand_in_agent("gpu1", tmp_path / "agent", mirror, fake_engine)
        await nursery.start(lambda task_status: run_agent(agent, plane.local_connector(), nvml=FakeNvml.h200(),
                                                          task_status=task_status))
        await wait_for(lambda: "1 ignored by agent settings" in unplaced_reasons(plane), 20,
                       "big-0 unplaced: its only card is ignored", lambda: plane.status())
        assert "big-0" not in {rid for rid, r in plane.status()["replicas"].items() if r.get("node")}
        nursery.cancel_scope.cancel()


async def test_status_shows_each_nodes_readings_with_their_age_updated_every_heartbeat(
    tmp_path, settings_repo, weights_mirror, fake_engine,
):
    mirror, _sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine)
        await nursery.start(lambda task_status: run_agent(agent, plane.local_connector(), nvml=FakeNvml.h200(),
                                                          task_status=task_status))
        await wait_for(lambda: (plane.status()["nodes"].get("n1") or {}).get("readings"), 20, "n1 readings")
        first = plane.snapshot().fleet.get("n1").readings
        await wait_for(lambda: plane.snapshot().fleet.get("n1").readings.at > first.at, 5, "the next heartbeat")
        readings = plane.status()["nodes"]["n1"]["readings"]
        assert 0 <= readings["age_seconds"] < 5
        assert readings["memory_available_bytes"] > 0 and readings["load1"] is not None
        (gpu,) = readings["gpus"]
        assert gpu["power_limit_watts"] == 700.0 and gpu["foreign_pids"] == []
        nursery.cancel_scope.cancel()


def test_readings_older_than_a_minute_are_absent_not_repeated():
    readings = NodeReadings(at=100.0, cpu_percent=12.5, memory_used_bytes=1 << 30)
    assert readings.to_json(now=130.0)["age_seconds"] == 30.0
    assert readings.to_json(now=160.0)["cpu_percent"] == 12.5
    assert readings.to_json(now=160.1) is None


async def test_a_node_away_when_an_agents_change_lands_gets_its_settings_on_return_and_the_audit_says_so(
    tmp_path, settings_repo, weights_mirror, fake_engine,
):
    from llmgw.agent.config import load_agent_settings
    from llmgw.plan import agent_settings_fingerprint
    from llmgw.settings import read_audit_log

    from .test_in_process_fleet import push_catalog

    mirror, _sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine)
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        away, gone = trio.CancelScope(), trio.Event()

        async def run_until_away(task_status=trio.TASK_STATUS_IGNORED):
            with away:
                await run_agent(agent, plane.local_connector(), task_status=task_status)
            gone.set()  # its engines stopped and its state directory released

        await nursery.start(run_until_away)
        first = agent_settings_fingerprint(plane.snapshot().settings, "n1")
        await wait_for(lambda: plane.snapshot().acked_settings.get("n1") == first, 20, "n1 acknowledged its settings")
        away.cancel()  # the node goes away ...
        await wait_for(lambda: not plane.registry.get("n1").connected, 10, "n1 disconnected")
        with trio.fail_after(20):
            await gone.wait()

        def slower_beats(checkout: Path) -> None:  # ... while an agents/ change lands
            path = checkout / "agents" / "default.yaml"
            path.write_text(path.read_text().replace("heartbeat_interval: 200ms", "heartbeat_interval: 300ms"))

        await push_catalog(tmp_path / "checkout", settings_repo, slower_beats, "agents: slower heartbeats")
        plane.wake_watcher()
        await wait_for(lambda: plane.snapshot().settings.agent_defaults.heartbeat_interval == 0.3, 10, "the change")
        second = agent_settings_fingerprint(plane.snapshot().settings, "n1")
        assert second != first and plane.snapshot().acked_settings.get("n1") is None

        await nursery.start(run_agent, agent, plane.local_connector())  # the node comes back
        await wait_for(lambda: plane.snapshot().acked_settings.get("n1") == second, 20, "n1 got the new settings")
        entries = await wait_for(lambda: [e for e in read_audit_log(str(settings_repo), 50)
                                          if f"agent settings {second} to n1" in e.message], 20, "the audit entry")
        assert entries[0].message.startswith("pass ")
        assert load_agent_settings(tmp_path / "agent").heartbeat_interval == 0.3  # what the agent keeps and applies
        nursery.cancel_scope.cancel()

"""A replica the control plane stops fails no request: its replacement is ready before it leaves, and it leaves the
routing table, finishes its requests in flight and only then stops (llmgw.agent.draining). Two ways it is stopped:
a settings push that replaces a model's only replica (a changed `context_size`), and its node drained
(`serving.drained`, what `llmgw node drain` commits), which moves the replica to the other node.

Clients: the official openai SDK with retries off, four at once, streaming and not, through the gateway of a real
control plane whose in-process agents run the llama-server stand-in with its tokens 40 ms apart, so requests are on
the old replica when it is told to stop."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import openai
import pytest
import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import init_repository

from .conftest import settings_seed, stand_in_agent
from support.sdk_clients import sdk_client
from .test_in_process_fleet import commit_directly, replica_states, wait_for

MODEL = """\
name: tiny
engine: llama.cpp
engine_version: b11434
weights:
  - source: https://example.invalid/tiny/tiny.gguf
    sha256: {sha}
replicas: 1
resources:
  cpu_cores: 0.1
  memory: 64Mi
context_size: {context}
engine_args: ["--fake-token-delay=0.04"]
"""
CLIENTS = 4


def live_shards(plane: ControlPlane) -> dict[str, tuple[str, str]]:
    """{shard id: (node, state)} of tiny-0's shards not stopped."""
    return {sid: (node, s["state"]) for node, doc in plane.status()["nodes"].items()
            for sid, s in doc["shards"].items() if s["replica"] == "tiny-0" and s["state"] != "stopped"}


def pushed(repo, sha: str, plane: ControlPlane) -> Callable[[], bool]:
    """Push a bigger context for tiny; return whether the roll is done (one new shard, ready, the pass converged)."""
    commit_directly(repo, "catalog/tiny.yaml", MODEL.format(sha=sha, context=1024).encode(), "bigger context")
    return lambda: (len(live := live_shards(plane)) == 1 and next(iter(live)) != "tiny-0/0"
                    and next(iter(live.values()))[1] == "ready" and plane.snapshot().last_pass.converged)


def drained(repo, sha: str, plane: ControlPlane) -> Callable[[], bool]:
    """Drain n1 (`serving.drained`, as `llmgw node drain n1` commits it); return whether tiny-0 moved to n2."""
    llmgw_yaml = settings_seed.LLMGW_YAML.format(name="test", poll="5s", interval="2s", lost="3s",
                                                 action_timeout="30s") + "  drained: [n1]\n"
    commit_directly(repo, "llmgw.yaml", llmgw_yaml.encode(), "llmgw node drain n1")
    return lambda: (list(live_shards(plane).values()) == [("n2", "ready")]
                    and plane.snapshot().last_pass.converged)


@pytest.mark.parametrize("change", [pushed, drained], ids=["push", "node-drain"])
async def test_a_replica_stopped_by_a_push_or_a_node_drain_fails_no_request(
        tmp_path, weights_mirror, fake_engine, caplog, change):
    caplog.set_level(logging.INFO, "llmgw.agent")
    mirror, sha = weights_mirror
    repo = tmp_path / "settings.git"
    init_repository(repo, settings_seed.write_seed(tmp_path / "seed", "tiny", MODEL.format(sha=sha, context=512)))
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        await nursery.start(run_agent, stand_in_agent("n1", tmp_path / "n1", mirror, fake_engine),
                            plane.local_connector())
        await wait_for(lambda: replica_states(plane).get("tiny-0") == "ready" and plane.table.models["tiny"].replicas,
                       30, "tiny-0 ready")
        if change is drained:  # a second node for the replica to move to, started once tiny-0 is on n1
            await nursery.start(run_agent, stand_in_agent("n2", tmp_path / "n2", mirror, fake_engine),
                                plane.local_connector())
            await wait_for(lambda: "n2" in plane.status()["nodes"], 30, "n2 registered")
        _record, api_key = plane.store.create_api_key("demo")
        client = openai.AsyncOpenAI(base_url=f"{plane.gateway_url}/v1", api_key=api_key, max_retries=0, timeout=30)
        answered: list[str] = []
        failed: list[str] = []
        done = trio.Event()

        async with trio.open_nursery() as users:
            for n in range(CLIENTS):
                users.start_soon(partial(sdk_client, client, n, done, answered, failed, model="tiny",
                                         max_tokens=12))
            await wait_for(lambda: len(answered) >= CLIENTS, 20, "every client answered once")
            rolled = change(repo, sha, plane)
            plane.wake_watcher()
            await wait_for(rolled, 60, "the replica replaced", plane.status)
            before = len(answered)
            await wait_for(lambda: len(answered) >= before + CLIENTS, 20, "answers from the new replica")
            done.set()
        assert failed == []
        drains = [r.getMessage() for r in caplog.records if "tiny-0/0 drained" in r.getMessage()]
        assert drains, "the old replica was stopped without a drain"
        await client.close()
        nursery.cancel_scope.cancel()

"""A settings push that replaces a model's only replica (a changed `context_size`) fails no request: the new replica
is ready before the old one leaves, and the old one leaves the routing table, finishes its requests in flight and
only then stops (llmgw.agent.draining).

Clients: the official openai SDK with retries off, four at once, streaming and not, through the gateway of a real
control plane whose in-process agent runs the llama-server stand-in with its tokens 40 ms apart, so requests are on
the old replica when it is told to stop."""

from __future__ import annotations

import logging
from functools import partial

import openai
import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import init_repository

from .conftest import settings_seed, stand_in_agent
from .sdk_clients import sdk_client
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


async def test_a_push_replacing_the_only_replica_fails_no_request(tmp_path, weights_mirror, fake_engine, caplog):
    caplog.set_level(logging.INFO, "llmgw.agent")
    mirror, sha = weights_mirror
    repo = tmp_path / "settings.git"
    init_repository(repo, settings_seed.write_seed(tmp_path / "seed", "tiny", MODEL.format(sha=sha, context=512)))
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state"))
    agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine)
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        await nursery.start(run_agent, agent, plane.local_connector())
        await wait_for(lambda: replica_states(plane).get("tiny-0") == "ready" and plane.table.models["tiny"].replicas,
                       30, "tiny-0 ready")
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
            commit_directly(repo, "catalog/tiny.yaml", MODEL.format(sha=sha, context=1024).encode(), "bigger context")
            plane.wake_watcher()

            def rolled() -> bool:
                shards = plane.status()["nodes"]["n1"]["shards"]
                live = {sid: s for sid, s in shards.items() if s["replica"] == "tiny-0" and s["state"] != "stopped"}
                return (len(live) == 1 and next(iter(live)) != "tiny-0/0"
                        and all(s["state"] == "ready" for s in live.values()) and plane.snapshot().last_pass.converged)

            await wait_for(rolled, 60, "the roll to finish", plane.status)
            before = len(answered)
            await wait_for(lambda: len(answered) >= before + CLIENTS, 20, "answers from the new replica")
            done.set()
        assert failed == []
        drained = [r.getMessage() for r in caplog.records if "tiny-0/0 drained" in r.getMessage()]
        assert drained, "the old replica was stopped without a drain"
        await client.close()
        nursery.cancel_scope.cancel()

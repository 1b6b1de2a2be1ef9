"""The whole fleet as separate processes: `llmgw server`, three `llmgw agent`s (one running the real llama-server
with Gemma 3 270M, two the llama-server stand-in), settings changed by `git push`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from support.in_process_cli import run_llmgw
from support.settings_seed import GEMMA_HEAD
from support.llmgw_processes import LlmgwProcesses
from support.waiting import wait_for

from .conftest import git, write_seed
from .test_in_process_fleet import commit_directly

GEMMA_YAML = GEMMA_HEAD + """\
replicas: {replicas}
resources:
  cpu_cores: 1
  memory: 1Gi
context_size: 2048
engine_args: ["--no-jinja", "--chat-template", "gemma", "-t", "2"]
node_selector: {{engine: real}}
"""


def shard_of(status: dict, node: str, replica: str) -> dict:
    """The status of `replica`'s shard on `node` (its id may carry a generation suffix while rolling)."""
    shards = [s for s in status["nodes"][node]["shards"].values() if s["replica"] == replica]
    if len(shards) != 1:
        raise KeyError(f"{len(shards)} shards of {replica} on {node}")
    return shards[0]


@pytest.mark.slow
def test_a_fleet_of_processes_follows_pushes_survives_kills_and_refuses_bad_commits(
    tmp_path, weights_mirror, fake_engine, llama_server_binary, gemma_mirror,
):
    mirror, sha = weights_mirror
    seed = write_seed(tmp_path / "seed", sha)
    from llmgw.settings import init_repository

    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    state = tmp_path / "state"
    fleet = LlmgwProcesses(tmp_path)
    try:
        fleet.spawn("server", "server", "--repo", str(repo), "--state", str(state),
                    "--gateway", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--agents", "127.0.0.1:0")
        wait_for(lambda: (state / "admin-url").is_file() and (state / "admin-token").is_file(), 30, "the server")
        admin = httpx.Client(base_url=(state / "admin-url").read_text().strip(), timeout=10, headers={
            "Authorization": f"Bearer {(state / 'admin-token').read_text().strip()}"})
        status = lambda: admin.get("/api/v1/status").json()  # noqa: E731
        show = lambda: json.dumps(status(), indent=1)  # noqa: E731
        plane = wait_for(lambda: status()["control_plane"], 30, "the admin API")
        address = f"127.0.0.1:{plane['agents_port']}"
        for node, binary, label in (("real", llama_server_binary, "real"), ("fake1", fake_engine, "fake"),
                                    ("fake2", fake_engine, "fake")):
            fleet.spawn(node, "agent", "--control-plane", address, "--node-id", node, "--state-dir",
                        str(tmp_path / node), "--mirror", str(mirror), "--mirror", str(gemma_mirror),
                        "--label", f"engine={label}", "--heartbeat-interval", "200ms", "--insecure",
                        "--engine-binary", f"llama.cpp@b11434={binary}", "--stop-shards-on-exit")
        wait_for(lambda: len(status()["nodes"]) == 3, 30, "three nodes", show)

        # the seed's tiny-0 has no node_selector yet; a push pins it to the stand-ins and adds Gemma
        checkout = tmp_path / "checkout"
        git("clone", "-q", str(repo), str(checkout), cwd=tmp_path)
        (checkout / "catalog" / "tiny.yaml").write_text(
            (checkout / "catalog" / "tiny.yaml").read_text() + "node_selector: {engine: fake}\n")
        (checkout / "catalog" / "gemma-3-270m.yaml").write_text(GEMMA_YAML.format(replicas=1))
        projects = checkout / "projects.yaml"
        projects.write_text(projects.read_text().replace("models: [tiny]", "models: [tiny, gemma-3-270m]"))
        git("add", "-A", cwd=checkout)
        git("commit", "-qm", "add gemma", cwd=checkout)
        git("push", "-q", "origin", "HEAD:main", cwd=checkout)
        replicas = lambda: status()["replicas"]  # noqa: E731
        wait_for(lambda: replicas()["gemma-3-270m-0"]["state"] == "ready" and replicas()["tiny-0"]["state"] == "ready"
                 and status()["pass"]["converged"], 120, "gemma and tiny ready", show)
        assert replicas()["gemma-3-270m-0"]["node"] == "real"
        assert replicas()["tiny-0"]["node"] in ("fake1", "fake2")

        # real text from the real engine through the gateway
        from llmgw.store import open_store

        store = open_store(state / "llmgw.sqlite3")
        _record, key = store.create_api_key("demo")
        gateway = status()["control_plane"]["gateway_url"]
        reply = httpx.post(f"{gateway}/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                           json={"model": "gemma-3-270m", "prompt": "The capital of France is", "max_tokens": 8,
                                 "temperature": 0, "seed": 1})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] > 0 and reply.json()["choices"][0]["text"]

        # an engine killed behind the agent's back is restarted
        tiny_node = replicas()["tiny-0"]["node"]
        pid = shard_of(status(), tiny_node, "tiny-0")["pid"]
        fleet.engine_pids.add(pid)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: shard_of(status(), tiny_node, "tiny-0").get("pid") not in (None, pid)
                 and replicas()["tiny-0"]["state"] == "ready", 60, "the engine restarted", show)
        fleet.engine_pids.add(shard_of(status(), tiny_node, "tiny-0")["pid"])

        # a killed agent's replicas are placed on the others
        fleet.procs[tiny_node].send_signal(signal.SIGKILL)
        other = "fake2" if tiny_node == "fake1" else "fake1"
        wait_for(lambda: status()["nodes"][tiny_node]["state"] == "lost", 30, "the node lost", show)
        wait_for(lambda: replicas()["tiny-0"].get("node") == other and replicas()["tiny-0"]["state"] == "ready",
                 60, "tiny-0 moved", show)

        # scaling Gemma to 0 stops it
        (checkout / "catalog" / "gemma-3-270m.yaml").write_text(GEMMA_YAML.format(replicas=0))
        git("commit", "-qam", "gemma: 0 replicas", cwd=checkout)
        git("push", "-q", "origin", "HEAD:main", cwd=checkout)
        wait_for(lambda: replicas().get("gemma-3-270m-0", {"state": "stopped"})["state"] == "stopped", 60,
                 "gemma stopped", show)

        # an invalid commit (written past the pre-receive hook, as a forge would) is not applied
        good = status()["settings"]["commit"]
        bad = commit_directly(repo, "catalog/tiny.yaml", b"name: tiny\nengine: llama.cpp\nreplicas: -3\n", "bad")
        assert admin.post("/api/v1/hooks/git", content=b"{}").status_code == 202
        doc = wait_for(lambda: (s := status())["settings"].get("bad") and s, 20, "the bad commit reported", show)
        assert doc["settings"]["commit"] == good and doc["settings"]["bad"]["commit"] == bad
        assert doc["settings"]["bad"]["issues"][0]["file"] == "catalog/tiny.yaml"
        assert doc["settings"]["bad"]["issues"][0]["line"] == 3

        # what was done is in `llmgw history` and in git
        def history() -> str:  # polled: run in this process (a process start costs about a second of imports)
            code, answer, err = run_llmgw(["history", "--limit", "100", "--json"], {"LLMGW_STATE": str(state)})
            assert code == 0, err
            # every pass's actions are in its audit commit's message (subjects name the first few; coalesced
            # commits hold the messages of every pass they stand for)
            return "\n".join(entry["message"] for entry in json.loads(answer)["entries"])

        # the audit is written behind the passes (at most one commit a second), so the last pass may still be queued
        def history_with_the_stop() -> str | None:
            text = history()
            return text if "stop gemma-3-270m-0/0 on real" in text else None

        done = wait_for(history_with_the_stop, 30, "the stop of gemma in `llmgw history`", history)
        assert "start gemma-3-270m-0/0 on real" in done
        assert f"start tiny-0/0 on {other}" in done or "start tiny-0/0@" in done
        log = git("log", "--format=%H %s", "refs/llmgw/audit", cwd=repo)
        assert len(log.splitlines()) >= 4 and "pass " in log
    finally:
        fleet.stop()

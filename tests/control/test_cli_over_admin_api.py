"""The `llmgw` client commands (two as real processes, the rest in this process) against a running control plane
with an in-process agent."""

from __future__ import annotations

import json
import os
import re
import sys

import httpx
import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane

from support.in_process_cli import run_llmgw

from .conftest import stand_in_agent
from .test_in_process_fleet import commit_directly, replica_states, wait_for


async def llmgw(plane: ControlPlane, *args: str, token: str | None = None,
                process: bool = False) -> tuple[int, str, str]:
    """Run `llmgw ARGS` against `plane` (its URL and token from the environment, as a user sets them): (exit
    status, stdout, stderr). `process`: as a real `python -m llmgw.cli` process; else the same command in this
    process, in a thread (a process start costs about a second of imports, and most commands here are not about
    the process boundary)."""
    env = dict(os.environ, LLMGW_ADMIN_URL=plane.admin_url, LLMGW_ADMIN_TOKEN=token or plane.admin_token)
    if process:
        done = await trio.run_process([sys.executable, "-m", "llmgw.cli", *args], env=env, capture_stdout=True,
                                      capture_stderr=True, check=False)
        return done.returncode, done.stdout.decode(), done.stderr.decode()
    return await trio.to_thread.run_sync(run_llmgw, list(args), env)


async def test_the_client_commands_drive_a_running_control_plane(tmp_path, settings_repo, weights_mirror, fake_engine):
    mirror, sha = weights_mirror
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine)
        await nursery.start(run_agent, agent, plane.local_connector())

        code, out, err = await llmgw(plane, "apply", "--timeout", "30", process=True)
        assert code == 0, out + err
        assert "converged to" in out and "tiny-0 ready" in out

        code, out, _ = await llmgw(plane, "status", "--json")
        status = json.loads(out)
        assert code == 0 and status["replicas"]["tiny-0"]["state"] == "ready"
        code, out, _ = await llmgw(plane, "status")
        assert "tiny-0" in out and "ready" in out and "n1" in out

        code, out, _ = await llmgw(plane, "plan")
        assert code == 0 and "no changes" in out
        text = (b"name: tiny\nengine: llama.cpp\nengine_version: b11434\nweights:\n"
                b"  - source: https://example.invalid/tiny/tiny.gguf\n    sha256: " + sha.encode() +
                b"\nreplicas: 2\nresources:\n  cpu_cores: 0.1\n  memory: 64Mi\n")
        target = await trio.to_thread.run_sync(commit_directly, settings_repo, "catalog/tiny.yaml", text, "two",
                                         "proposal")
        code, out, _ = await llmgw(plane, "plan", target)
        assert code == 2 and "start" in out and "tiny-1" in out

        code, out, _ = await llmgw(plane, "nodes")
        assert code == 0 and out.startswith("n1") and " 0 GPUs " in out
        code, out, _ = await llmgw(plane, "status")
        assert "0 GPUs, 1 shard\n" in out  # not "1 shards"
        code, out, _ = await llmgw(plane, "replicas", "--json")
        assert "tiny-0" in json.loads(out)["replicas"]
        code, out, err = await llmgw(plane, "logs", "n1", "--shard", "nope/0")
        # Engines of other llmgw instances on this machine are listed too, as foreign/<pid>: the test sees only its own.
        listed = re.search(r"node 'n1' reports no shard 'nope/0' \(its shards: ([^)]*)\)", err)
        assert code == 1 and listed, err
        assert [s for s in listed[1].split(", ") if not s.startswith("foreign/")] == ["tiny-0/0"]
        code, out, err = await llmgw(plane, "logs", "n1", "--shard", "tiny-0/0", "--json")
        assert code == 0, err
        assert isinstance(json.loads(out)["lines"], list)

        code, out, err = await llmgw(plane, "stop", "--author-name", "Ada", "--author-email", "ada@example.com")
        assert code == 0, err
        await wait_for(lambda: not any(s == "ready" for s in replica_states(plane).values()), 30, "stopped")
        async with httpx.AsyncClient(base_url=plane.gateway_url) as client:
            _record, key = plane.store.create_api_key("demo")
            reply = await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                      json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 503 and "system_stopped" in reply.text
        code, out, _ = await llmgw(plane, "replicas")
        assert code == 0 and "serving is stopped (`llmgw stop`)" in out and "`llmgw start` resumes" in out
        code, out, err = await llmgw(plane, "start", "--author-name", "Ada", "--author-email", "ada@example.com")
        assert code == 0, err
        await wait_for(lambda: "ready" in replica_states(plane).values(), 30, "serving again")

        await plane.audit.flush(10)
        code, out, _ = await llmgw(plane, "history", "--limit", "50")
        assert code == 0 and "stop tiny-0/0 on n1" in out and "start tiny-0/0 on n1" in out
        assert re.search(r"^[0-9a-f]{12}  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d [A-Z+-][A-Za-z0-9+-]*  pass ", out, re.M), out

        code, _, err = await llmgw(plane, "status", token="wrong", process=True)
        assert code == 1 and "refused the token" in err
        nursery.cancel_scope.cancel()

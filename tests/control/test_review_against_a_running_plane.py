"""`llmgw review --admin` and `llmgw fleet snapshot` against a running control plane whose stand-in agents report an
8 x H100 node and a CPU node (the example settings: gpu-node-01 is in zone eu-west-1). The commands run in a thread
of the test's process (support.in_process_cli); a refused token and one review run as real processes (exit status,
streams, the environment's admin URL and token)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import trio
from support.in_process_cli import run_llmgw

from llmgw.agent.reporting import FEATURES
from llmgw.control import ControlConfig, ControlPlane
from llmgw.plan import fingerprint
from llmgw.settings import Listener, init_repository, load_commit
from llmgw.store import UsageRecord
from llmgw.wire import agent_message
from llmgw.wire import agent_pb2 as pb

from .conftest import ROOT, git
from .test_in_process_fleet import wait_for

GiB = 1024**3
LLAMA = "catalog/llama-3.1-70b-instruct.yaml"


def h100_register() -> pb.Register:
    ids = [str(i) for i in range(8)]
    gpus = [pb.Gpu(index=i, uuid=f"GPU-{i:04d}", name="NVIDIA H100 80GB HBM3", gpu_class="h100-80g", device_id=ids[i],
                   memory_total_bytes=80 * GiB, memory_free_bytes=80 * GiB, numa_node=i // 4,
                   nvlink_peers=[d for d in ids if d != ids[i]]) for i in range(8)]
    return pb.Register(node_id="gpu-node-01", address="10.0.0.1", os="linux", node_secret="g" * 43, arch="x86_64", cpu_cores=64,
                       memory_total_bytes=512 * GiB, gpus=gpus, engines_installed=["llama.cpp@b11434", "vllm@0.11.0"],
                       features=list(FEATURES))


def cpu_register(settings, commit: str) -> pb.Register:
    """The CPU node running the example's llama.cpp models (gemma-3-270m-0, smollm2-135m-instruct-0), ready."""
    running = []
    for port, name in enumerate(("gemma-3-270m", "smollm2-135m-instruct"), start=20000):
        model = settings.models[name]
        running.append(pb.ShardStatus(shard_id=f"{name}-0/0", replica_id=f"{name}-0", model=name, state="ready",
                                      fingerprint=fingerprint(model, model.engine_version), settings_commit=commit,
                                      cpu_cores=model.resources.cpu_cores, memory_bytes=GiB, port=port))
    return pb.Register(node_id="cpu-node-01", address="10.0.0.2", os="linux", node_secret="c" * 43, arch="x86_64", cpu_cores=8,
                       memory_total_bytes=32 * GiB, engines_installed=["llama.cpp@b11434"], shards=running,
                       features=list(FEATURES))


async def stand_in_agent(plane: ControlPlane, register: pb.Register, *, acknowledge: bool = False,
                         task_status=trio.TASK_STATUS_IGNORED):
    """Register `register` with `plane`, then beat every 0.2 s reporting the same shards; commands are read and
    left undone (the fleet is converged to the base settings, so none should come), but for agent settings, which
    are acknowledged when `acknowledge` (a settings change then converges)."""
    async with plane.local_connector()() as link:
        await link.send(agent_message(register=register))

        async def drain():
            async for message in link:
                if acknowledge and message.WhichOneof("body") == "agent_settings":
                    await link.send(agent_message(command_result=pb.CommandResult(
                        command_id=message.command_id, ok=True)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            task_status.started()
            while True:
                await link.send(agent_message(heartbeat=pb.Heartbeat(
                    time=time.time(), shard_states=list(register.shards),
                    engines_installed=list(register.engines_installed))))
                await trio.sleep(0.2)


async def llmgw(plane: ControlPlane, *args: str, cwd: Path, from_env: bool = True,
                process: bool = False) -> tuple[int, str, str]:
    """`llmgw ARGS` in `cwd` with no LLMGW_* variable but, with `from_env`, the plane's admin URL and token: in a
    thread of the test's process (support.in_process_cli; the plane's loop runs meanwhile), or as a real process."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("LLMGW_")}
    if from_env:
        env.update(LLMGW_ADMIN_URL=plane.admin_url, LLMGW_ADMIN_TOKEN=plane.admin_token)
    if not process:
        return await trio.to_thread.run_sync(run_llmgw, list(args), env, cwd)
    done = await trio.run_process([sys.executable, "-m", "llmgw.cli", *args], capture_stdout=True,
                                  capture_stderr=True, check=False, cwd=cwd,
                                  env={k: v for k, v in (os.environ | env).items() if v is not None})
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def pull_request(clone: Path, name: str, rel: str, old: str, new: str) -> None:
    git("checkout", "-q", "-b", name, "main", cwd=clone)
    text = (clone / rel).read_text()
    assert text.count(old) == 1
    (clone / rel).write_text(text.replace(old, new))
    git("commit", "-qam", name, cwd=clone)
    git("checkout", "-q", "main", cwd=clone)


def example_repository(tmp_path: Path) -> tuple[Path, Path]:
    """A settings repository of examples/cluster-repo under `tmp_path`, and a clone of it: (repository, clone)."""
    seed = tmp_path / "seed"
    shutil.copytree(ROOT / "examples" / "cluster-repo", seed)
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    clone = tmp_path / "clone"
    git("clone", "-q", str(repo), str(clone), cwd=tmp_path)
    return repo, clone


async def test_review_reads_the_live_fleet_through_the_admin_api(tmp_path):
    repo, clone = example_repository(tmp_path)
    pull_request(clone, "add-70b", LLAMA, "\nreplicas: 0\n", "\nreplicas: 1\n")
    pull_request(clone, "add-five", LLAMA, "\nreplicas: 0\n", "\nreplicas: 5\n")
    pull_request(clone, "more-ci", "projects.yaml", "requests_per_minute: 120", "requests_per_minute: 240")
    pull_request(clone, "two-gemma", "catalog/gemma-3-270m.yaml", "\nreplicas: 1\n", "\nreplicas: 2\n")

    base = load_commit(repo, "main")
    any_port = Listener("127.0.0.1", 0)
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", gateway_listener=any_port,
                                       admin_listener=any_port, agents_listener=any_port))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        await nursery.start(stand_in_agent, plane, h100_register())
        await nursery.start(stand_in_agent, plane, cpu_register(base, base.commit))
        await wait_for(lambda: len(plane.registry.fleet().nodes) == 2, 20, "two nodes")
        now = time.time()
        for i in range(4):  # gemma's traffic: ci's requests in the last hour, one of 5 days ago (outside the window)
            await trio.to_thread.run_sync(plane.store.record_usage, UsageRecord(
                "ci", "gemma-3-270m", now - 60 * (i + 1), replica="gemma-3-270m-0", prompt_tokens=100,
                completion_tokens=20, ttft_seconds=0.1 * (i + 1)))
        await trio.to_thread.run_sync(plane.store.record_usage, UsageRecord("ci", "gemma-3-270m", now - 5 * 86400,
                                                                            prompt_tokens=7))

        code, out, err = await llmgw(plane, "fleet", "snapshot", "-o", str(tmp_path / "fleet.json"), cwd=clone)
        assert code == 0, err
        snapshot = json.loads((tmp_path / "fleet.json").read_text())
        assert [n["node_id"] for n in snapshot["nodes"]] == ["cpu-node-01", "gpu-node-01"]
        assert len(snapshot["nodes"][1]["gpus"]) == 8 and snapshot["settings_commit"] == base.commit
        assert snapshot["taken_at"].endswith("Z") and snapshot["revision"].startswith("sha256:")
        load = snapshot["load"]
        assert load["window_seconds"] == 3 * 86400 and load["until"] == snapshot["taken_at"]
        assert load["traffic"] == [{"model": "gemma-3-270m", "project": "ci", "requests": 4, "prompt_tokens": 400,
                                    "completion_tokens": 80, "errors": 0}]
        assert load["models"]["gemma-3-270m"]["ttft_p90_seconds"] == 0.4
        assert load["models"]["gemma-3-270m"]["busiest_hour_requests"] in (2, 3, 4)  # the 4 minutes may span 2 hours

        code, out, err = await llmgw(plane, "review", "main", "two-gemma", "--json", cwd=clone)
        assert code == 2, err
        (gemma,) = json.loads(out)["forecast"]["models"]
        assert (gemma["model"], gemma["replicas_before"], gemma["replicas_after"]) == ("gemma-3-270m", 1, 2)
        assert gemma["ttft_p90_before"] == 0.4 and [q["project"] for q in gemma["quotas"]] == ["assistants", "ci", "demo"]
        assert gemma["unknown"] == ["no measured speed (run `llmgw bench` on a replica of it)"]
        (tmp_path / "review.json").write_text(out)

        # `llmgw plan REV` reads the control plane's repository, which takes pushes to main only: fetched there
        git("fetch", "-q", str(clone), "two-gemma:refs/heads/two-gemma", cwd=repo)
        code, out, err = await llmgw(plane, "plan", "two-gemma", cwd=clone)
        assert code == 2, err
        assert ("forecast gemma-3-270m: 1 -> 2 replicas, not forecast: no measured speed (run `llmgw bench` on a "
                "replica of it), 0 -> 0 GPU-hours/day") in out.splitlines()

        code, out, err = await llmgw(plane, "forecast-check", str(tmp_path / "review.json"), "--window", "30m",
                                     "--json", cwd=clone)
        assert code == 0, err
        (check,) = json.loads(out)
        assert check["model"] == "gemma-3-270m" and check["requests"] == 4  # the last 30 minutes only
        assert check["rate_measured"] == 4 / 1800 and check["ttft_p90_measured"] == 0.4

        code, out, err = await llmgw(plane, "review", "main", "add-70b", "--json", cwd=clone)
        assert code == 2, err
        document = json.loads(out)
        assert document["fleet"]["source"] == f"admin API {plane.admin_url}"
        assert document["fleet"]["revision"] == snapshot["revision"]
        steps = {n["node_id"]: [(s["verb"], s["subject"], s["where"]) for s in n["steps"]]
                 for n in document["nodes"]}
        assert steps == {"cpu-node-01": [], "gpu-node-01": [("start", "llama-3.1-70b-instruct-0/0", "GPU 0,1")]}

        code, out, err = await llmgw(plane, "review", "main", "add-five", "--format", "markdown", cwd=clone)
        assert code == 3, err
        assert "| `llama-3.1-70b-instruct-3` | cpu-node-01 | labels do not match node_selector zone=eu-west-1 |" in out
        assert "|  | gpu-node-01 | 1 of 2 h100-80g free (6 held by shards) |" in out  # GPU 7 ignored by settings

        code, out, err = await llmgw(plane, "review", "main", "more-ci", "--json", cwd=clone)
        assert code == 2, err
        document = json.loads(out)
        assert not document["plan"]["changes"] and [p["project"] for p in document["projects"]] == ["ci"]

        code, out, err = await llmgw(plane, "review", "main", "main", "--admin", plane.admin_url, "--token",
                                     plane.admin_token, cwd=clone, from_env=False)
        assert code == 0, err
        code, out, err = await llmgw(plane, "fleet", "snapshot", "--admin", plane.admin_url, "--token", "wrong",
                                     cwd=clone, from_env=False, process=True)
        assert code == 1 and "refused the token" in err and out == ""
        code, out, err = await llmgw(plane, "review", "main", "add-70b", "--json", cwd=clone, process=True)
        assert code == 2 and json.loads(out)["fleet"]["source"] == f"admin API {plane.admin_url}", err
        nursery.cancel_scope.cancel()

"""Slurm beside llmgw through the control plane and an in-process agent, with real Slurm 22.05 on this machine: the
agent is told its part (controller and lendable node, with accounting), runs munged, slurmdbd, slurmctld and slurmd
on loopback ports of their own; `llmgw slurm lend` moves the replica off and resumes the node (srun runs with the
project's account); `llmgw slurm reclaim` while a job runs keeps the node closed until the job ends, then the
replica is placed again; the job is in `llmgw usage` once with its price; `llmgw slurm status` shows it all.

The agent reads the node in Slurm every second (`slurm_check_interval`; 10 s by default), and the batch job runs
until the test has seen the reclaim wait for it, then ends (a file it waits for): the job's start and end reach the
control plane within about a second instead of at the next 10 s check, and no test waits out a fixed job length.

Slow: about 25 s. Fails, never skips, when Slurm, munge or MariaDB is missing (`make system-packages`)."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time

import pytest
import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane
from llmgw.plan.slurm_roles import storage_names
from slurm.local_slurm import drop_storage, loopback_settings, require_slurm
from support.settings_seed import projects_yaml

from .conftest import stand_in_agent, write_seed
from .test_cli_over_admin_api import llmgw
from .test_in_process_fleet import replica_states, wait_for

# one pytest-xdist worker for the real-Slurm modules, vLLM and llmgw up (tests/conftest.py, MACHINE_WIDE)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("machine-wide")]

HOST = socket.gethostname().split(".")[0]
WHO = ("--author-name", "Ada", "--author-email", "ada@example.com")
PROJECTS = projects_yaml({"demo": {"models": ["tiny"], "members": ["root@acme.example"]}})


def slurm_yaml(slurm) -> str:
    ports = slurm.ports
    return (f"enabled: true\ncluster_name: {slurm.cluster_name}\ncontroller: {HOST}\nnodes:\n  {HOST}: "
            "{partition: debug}\npartitions:\n  debug: {default: true}\naccounting: true\n"
            "proctrack_type: proctrack/linuxproc\ntask_plugin: task/none\n"
            f"ports: {{slurmctld: {ports['slurmctld']}, slurmd: {ports['slurmd']}, slurmdbd: {ports['slurmdbd']}}}\n")


async def test_lend_run_reclaim_and_bill_a_node_through_the_control_plane(tmp_path, weights_mirror, fake_engine):
    from llmgw.settings import init_repository

    require_slurm()
    mirror, sha = weights_mirror
    slurm = loopback_settings(HOST)
    seed = write_seed(tmp_path / "seed", sha)
    (seed / "agents" / "nodes").mkdir()
    (seed / "agents" / "nodes" / f"{HOST}.yaml").write_text("{}\n")
    (seed / "slurm.yaml").write_text(slurm_yaml(slurm))
    (seed / "projects.yaml").write_text(PROJECTS)
    (seed / "llmgw.yaml").write_text((seed / "llmgw.yaml").read_text() + "prices:\n  gpu_hour_cost: {cpu: 3600}\n")
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    (secrets_dir / "munge-key").write_text(secrets.token_urlsafe(48))
    user, database = storage_names(slurm)
    env = dict(os.environ, SLURM_CONF=str(tmp_path / "agent" / "slurm" / "etc" / "slurm.conf"))

    def slurm_cmd(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=60, env=env)

    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", secrets_dir=secrets_dir))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(plane.run)
            agent = stand_in_agent(HOST, tmp_path / "agent", mirror, fake_engine, slurm_check_interval=1.0)
            await nursery.start(run_agent, agent, plane.local_connector())

            def node_slurm() -> dict:
                return plane.status()["nodes"].get(HOST, {}).get("slurm") or {}

            await wait_for(lambda: node_slurm().get("daemons", {}).get("slurmd", {}).get("state") == "running"
                           and "drain" in node_slurm().get("node_state", ""), 60, "the Slurm daemons and a drained node")
            assert set(node_slurm()["daemons"]) == {"munged", "slurmdbd", "slurmctld", "slurmd"}
            await wait_for(lambda: "ready" in replica_states(plane).values(), 30, "the replica")

            code, out, err = await llmgw(plane, "slurm", "lend", HOST, *WHO)
            assert code == 0, err
            await wait_for(lambda: "ready" not in replica_states(plane).values(), 30, "the lent node's replica stopped")
            await wait_for(lambda: "drain" not in node_slurm().get("node_state", "drain"), 30, "the node resumed")
            done = slurm_cmd("srun", "-N1", "-A", "demo", "hostname")
            assert done.returncode == 0 and done.stdout.strip() == HOST, done.stderr

            release = tmp_path / "release-the-job"  # the job runs at least 3 s, then until this file is there
            job = slurm_cmd("sbatch", "--parsable", "-A", "demo", "-o", "/dev/null", "--wrap",
                            f"sleep 3; for i in $(seq 1200); do [ -e {release} ] && exit 0; sleep 0.1; done"
                            ).stdout.strip()
            await wait_for(lambda: node_slurm().get("job_steps", 0) >= 1, 30, "the job running")
            running_since = time.monotonic()
            code, out, err = await llmgw(plane, "slurm", "reclaim", HOST, *WHO)
            assert code == 0, err
            await wait_for(lambda: "drain" in node_slurm().get("node_state", ""), 30, "the node drained in Slurm")
            code, out, _ = await llmgw(plane, "slurm", "status")
            assert f"{HOST}: reclaiming" in out, out
            replica = plane.status()["replicas"]["tiny-0"]
            assert "waiting for its last" in replica["unplaced"][HOST]  # closed while the job step runs
            assert "ready" not in replica_states(plane).values()
            release.touch()
            held = time.monotonic() - running_since  # the job ran at least this long (and at least 3 s)
            await wait_for(lambda: "ready" in replica_states(plane).values(), 60, "the replica placed after the job")
            assert slurm_cmd("sacct", "-n", "-X", "-j", job, "-o", "State").stdout.split() == ["COMPLETED"]

            await wait_for(lambda: any(r.group == "slurm/debug" and r.requests == 2
                                       for r in plane.store.query_usage(by="model")), 30, "the jobs in usage",
                           lambda: {"usage": plane.store.query_usage(by="model"), "slurm": node_slurm(),
                                    "sacct": slurm_cmd("sacct", "-a", "-P", "-X", "-o", "JobID,State,End").stdout})
            code, out, err = await llmgw(plane, "usage", "--state", str(tmp_path / "state"), "--by", "model")
            assert code == 0 and "slurm/debug" in out, out + err
            [row] = [r for r in plane.store.query_usage(by="model") if r.group == "slurm/debug"]
            # one unit a core-second: the two jobs' cores times their elapsed seconds as Slurm counted them, the
            # sbatch job's at least as long as the test saw it run
            accounted = {line.split("|")[0]: (int(line.split("|")[1]), int(line.split("|")[2])) for line in slurm_cmd(
                "sacct", "-a", "-nP", "-X", "-o", "JobID,ElapsedRaw,AllocCPUS").stdout.split()}
            assert row.cost == pytest.approx(sum(seconds * cpus for seconds, cpus in accounted.values())), accounted
            assert accounted[job][0] >= max(3, int(held)), (accounted, held)
            assert "demo|root|" in slurm_cmd("sacctmgr", "-nP", "show", "assoc", "format=Account,User,ParentName").stdout
            nursery.cancel_scope.cancel()
    finally:
        drop_storage(database, user)

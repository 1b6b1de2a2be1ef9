"""The agent keeps real Slurm 22.05 daemons on this machine as the control plane's SlurmRole says: the role is what
the control plane sends (llmgw.control.commands.slurm_role, from slurm.yaml, a fleet of this one node and the munge
key secret), the keeper (llmgw.agent.slurm) writes the key and the files, makes slurmdbd's database and user on
MariaDB, starts munged, slurmdbd, slurmctld and slurmd on loopback with their own ports and state, keeps the node
drained until it is lent, resumes it when lent (srun and sbatch run, and both jobs are read back from sacct and
priced into usage once each), starts slurmd again when it is killed, leaves an
administrator's drain alone, and stops everything when told the node has no part.

Slow: about 20 s. Fails, never skips, when Slurm, munge or MariaDB is missing (`make system-packages`)."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
from dataclasses import replace
from types import MappingProxyType

import pytest
import trio

from llmgw.agent.slurm import SlurmKeeper, SlurmLayout
from llmgw.control.commands import slurm_role
from llmgw.control.slurm_usage import slurm_usage
from llmgw.plan import Fleet, NodeState
from llmgw.plan.slurm_conf import DRAIN_REASON
from llmgw.plan.slurm_roles import storage_names
from llmgw.settings.model import ClusterSettings, Organisation, Project, Settings, Team
from llmgw.settings.slurm import SlurmNode
from llmgw.store import open_store
from llmgw.tools.slurm import parse_slurmd_config

from .local_slurm import drop_storage, loopback_settings, mysql, require_slurm

# one pytest-xdist worker for the real-Slurm modules, vLLM and llmgw up (tests/conftest.py, MACHINE_WIDE)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("machine-wide")]

HOST = socket.gethostname().split(".")[0]  # the controller's node id is its short hostname (slurmctld checks)
MiB = 1 << 20


def settings_for(lent: bool, base: Settings | None = None) -> Settings:
    if base is None:  # root runs the jobs here: its login comes from the member's e-mail
        return Settings(
            cluster=ClusterSettings(name="t"), slurm=loopback_settings(HOST),
            organisations=MappingProxyType({"acme": Organisation("acme")}),
            teams=MappingProxyType({"platform": Team("platform", "acme")}),
            projects=MappingProxyType({"ci": Project("ci", "platform", "acme", members=("root@acme.example",))}))
    slurm = replace(base.slurm, nodes=MappingProxyType({HOST: SlurmNode("debug", lent=lent)}))
    return replace(base, slurm=slurm)


def this_node() -> Fleet:
    config = parse_slurmd_config(subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout)
    return Fleet((NodeState(HOST, address="127.0.0.1", cpu_cores=config.cpus, memory_bytes=config.memory_mib * MiB),))


def run(layout: SlurmLayout, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, env=layout.env())


async def wait_for(what: str, check, timeout: float = 30) -> None:
    with trio.move_on_after(timeout):
        while not check():
            await trio.sleep(0.2)
        return
    raise AssertionError(f"timed out waiting for {what}")


async def test_the_agent_runs_slurm_as_its_role_says(tmp_path) -> None:
    require_slurm()
    settings = settings_for(False)
    fleet = this_node()
    key = secrets.token_hex(32)
    user, database = storage_names(settings.slurm)
    layout = SlurmLayout(tmp_path / "slurm")
    try:
        async with trio.open_nursery() as nursery:
            keeper = SlurmKeeper(layout, nursery)
            role = slurm_role(settings, fleet, HOST, {"munge-key": key}.__getitem__)
            await keeper.apply(role)
            report = keeper.report()
            assert report is not None and not report.warnings, report
            assert [(d.name, d.state) for d in report.daemons] == [
                ("munged", "running"), ("slurmdbd", "running"), ("slurmctld", "running"), ("slurmd", "running")]
            assert report.version.startswith("slurm") and "drain" in report.node_state
            assert report.node_reason.startswith(DRAIN_REASON)  # not lent: drained with llmgw's reason

            assert layout.munge_key.read_bytes() == key.encode()
            assert layout.munge_key.stat().st_mode & 0o777 == 0o400
            assert (layout.etc / "slurmdbd.conf").stat().st_mode & 0o777 == 0o600
            for daemon in keeper.daemons.values():  # the key and the database password on no command line
                with open(f"/proc/{daemon.pid}/cmdline", "rb") as file:
                    argv = file.read()
                assert key.encode() not in argv and role.storage_password.encode() not in argv
            assert mysql(f"SHOW DATABASES LIKE '{database}';").strip() == database  # made by the agent

            assocs = run(layout, "sacctmgr", "-nP", "show", "assoc", "format=Account,User,ParentName").stdout
            assert {"org-acme||root", "team-platform||org-acme", "ci||team-platform", "ci|root|"} <= set(
                assocs.split()), assocs  # projects became accounts, members their users
            lent = slurm_role(settings_for(True, settings), fleet, HOST, {"munge-key": key}.__getitem__)
            await keeper.apply(lent)
            assert keeper.node_state.split("+")[0] in ("idle", "mixed") and "drain" not in keeper.node_state
            done = run(layout, "srun", "-N1", "-A", "ci", "hostname")
            assert done.returncode == 0 and done.stdout.strip() == HOST, done.stderr

            run(layout, "sbatch", "-A", "ci", "-o", "/dev/null", "--wrap", "sleep 2")
            with trio.fail_after(60):
                while len([j for j in keeper.finished_jobs if j.state == "completed"]) < 2:
                    await trio.sleep(0.2)
                    await keeper.read_finished_jobs()
            report = keeper.report()
            assert [(j.partition, j.account, j.user) for j in report.finished_jobs] == [("debug", "ci", "root")] * 2
            store = open_store(tmp_path / "usage.sqlite3")
            for _ in range(2):  # every beat carries them again: recorded once
                for job in report.finished_jobs:
                    store.record_usage_once(*reversed(slurm_usage(job, report.cluster_name, HOST, {"cpu": 3600.0})))
            [row] = store.query_usage(by="model")
            wrap = report.finished_jobs[1]
            assert (row.group, row.requests, row.errors) == ("slurm/debug", 2, 0)
            assert wrap.elapsed_seconds >= 2 and row.cost >= wrap.cpus * wrap.elapsed_seconds  # a core-second each
            store.close()

            slurmd = keeper.daemons["slurmd"]
            first = slurmd.pid
            os.kill(first, 9)
            await wait_for("slurmd to run again", lambda: slurmd.state == "running" and slurmd.pid != first)
            assert slurmd.restarts == 1 and "signal SIGKILL" in slurmd.error
            await wait_for("the node to answer again",
                           lambda: run(layout, "srun", "-N1", "-A", "ci", "true").returncode == 0)

            # a job that runs until the test lets it end (it was `sleep 6`: 6 s waited, and too short under load)
            release = tmp_path / "release-the-job"
            job = run(layout, "sbatch", "--parsable", "-A", "ci", "-o", "/dev/null", "--wrap",
                      f"while [ ! -e {release} ]; do sleep 0.1; done").stdout.strip()
            await wait_for("the job to run", lambda: "RUNNING" in run(layout, "squeue", "-h", "-j", job, "-o", "%T").stdout)
            await keeper.apply(role)  # reclaimed: drained in Slurm, its job step counted until it ends
            assert "drain" in keeper.node_state and keeper.job_steps >= 1
            assert keeper.report().job_steps == keeper.job_steps
            await keeper.check_node()
            assert keeper.job_steps >= 1  # still counted while it runs
            release.touch()
            with trio.fail_after(30):
                while keeper.job_steps:
                    await trio.sleep(0.2)
                    await keeper.check_node()
            assert run(layout, "sacct", "-n", "-X", "-j", job, "-o", "State").stdout.split() == ["COMPLETED"]
            await keeper.apply(lent)

            run(layout, "scontrol", "update", f"NodeName={HOST}", "State=DRAIN", "Reason=disk swap by admin")
            await keeper.apply(lent)  # lent, but drained by someone else: left alone
            assert "drain" in keeper.node_state and keeper.node_reason.startswith("disk swap by admin")

            pids = [d.pid for d in keeper.daemons.values()]
            await keeper.apply(slurm_role(replace(settings, slurm=replace(settings.slurm, enabled=False)), fleet,
                                          HOST, {"munge-key": key}.__getitem__))
            assert keeper.report() is None and not keeper.daemons
            for pid in pids:
                assert not os.path.exists(f"/proc/{pid}")
            nursery.cancel_scope.cancel()
    finally:
        drop_storage(database, user)

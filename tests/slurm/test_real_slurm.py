"""Real Slurm 22.05 (Debian slurm-wlm) on this machine, configured by what llmgw renders: a node enters drained with
llmgw's reason, is lent (resumed), runs `srun hostname` and an `sbatch` job, both read back once each from
`sacct --parsable2` through llmgw's parser; a drain an administrator made is left alone.

Slow: about 20 s. Fails, never skips, when Slurm, munge or MariaDB is missing (`make system-packages`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from llmgw.plan.slurm_conf import DRAIN_REASON
from llmgw.tools.slurm import SACCT_FIELDS, drain_verdict, parse_sacct

from .local_slurm import NODE, LocalSlurm, require_slurm

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path: Path):
    require_slurm()
    slurm = LocalSlurm(tmp_path / "slurm")
    try:
        slurm.start()
        yield slurm
    finally:
        slurm.stop()


def lend(cluster: LocalSlurm) -> None:
    """What the agent does for a lent node: resume it only when llmgw's own drain holds it."""
    if drain_verdict(cluster.node(), True, DRAIN_REASON) == "resume":
        cluster.run("scontrol", "update", f"NodeName={NODE}", "State=RESUME")


def test_a_lent_node_runs_jobs_that_sacct_reports_once_each(cluster: LocalSlurm) -> None:
    node = cluster.node()
    assert node.drain and node.reason == DRAIN_REASON  # every node enters drained, with llmgw's reason
    lend(cluster)
    assert not cluster.node().drain
    cluster.run("sacctmgr", "-i", "add", "account", "proj-ci", "Description=ci", "Organization=acme")
    cluster.run("sacctmgr", "-i", "add", "user", "root", "Account=proj-ci")
    assert "|proj-ci|root|" in cluster.run("sacctmgr", "-nP", "show", "assoc").stdout

    done = cluster.run("srun", "-N1", "-A", "proj-ci", "hostname")
    assert done.stdout.strip() == cluster.hostname
    cluster.run("sbatch", "-A", "proj-ci", "-o", "/dev/null", "--wrap", "sleep 1")

    deadline = time.monotonic() + 30
    jobs = ()
    while time.monotonic() < deadline:
        jobs = parse_sacct(cluster.run("sacct", "-a", "--parsable2", "--format=" + ",".join(SACCT_FIELDS)).stdout)
        if len(jobs) == 2 and all(j.ended for j in jobs):
            break
        time.sleep(0.5)
    assert [(j.name, j.state, j.partition, j.account) for j in jobs] == [
        ("hostname", "completed", "debug", "proj-ci"), ("wrap", "completed", "debug", "proj-ci")], cluster.logs()
    assert all(j.cpus >= 1 and j.gpus == 0 for j in jobs)


def test_a_drain_an_administrator_made_is_left_alone(cluster: LocalSlurm) -> None:
    lend(cluster)
    cluster.run("scontrol", "update", f"NodeName={NODE}", "State=DRAIN", "Reason=disk swap by admin")
    node = cluster.node()
    assert node.drain and node.reason.startswith("disk swap by admin [")
    assert drain_verdict(node, True, DRAIN_REASON) is None
    lend(cluster)
    assert cluster.node().drain  # still drained: not ours to resume

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

# one pytest-xdist worker for the real-Slurm modules, vLLM and llmgw up (tests/conftest.py, MACHINE_WIDE)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("machine-wide")]


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


def test_projects_become_accounts_and_an_administrators_account_is_left_alone(cluster: LocalSlurm) -> None:
    from types import MappingProxyType

    from llmgw.plan.slurm_accounts import account_commands
    from llmgw.settings.model import ClusterSettings, Organisation, Project, Settings, Team
    from llmgw.tools.slurm import parse_sacctmgr_accounts, parse_sacctmgr_assocs

    cluster.run("sacctmgr", "-i", "add", "account", "physics", "Description=by hand", "Organization=uni")
    settings = Settings(
        cluster=ClusterSettings(name="t"), organisations=MappingProxyType({"acme": Organisation("acme")}),
        teams=MappingProxyType({"platform": Team("platform", "acme")}),
        projects=MappingProxyType({"ci": Project("ci", "platform", "acme", members=("alice@acme.example",)),
                                   "demo": Project("demo", "platform", "acme")}))
    name = cluster.slurm.cluster_name

    def current():
        accounts = parse_sacctmgr_accounts(cluster.run(
            "sacctmgr", "-nP", "show", "account", "format=Account,Description,Organization").stdout)
        assocs = parse_sacctmgr_assocs(cluster.run(
            "sacctmgr", "-nP", "show", "assoc", "format=Cluster,Account,User,ParentName").stdout)
        return accounts, assocs

    for command in account_commands(settings, name, *current()):
        cluster.run("sacctmgr", *command)
    accounts, assocs = current()
    parents = {a.account: a.parent for a in assocs if not a.user}
    assert (parents["org-acme"], parents["team-platform"], parents["ci"], parents["demo"]) == (
        "root", "org-acme", "team-platform", "team-platform")
    assert ("ci", "alice") in {(a.account, a.user) for a in assocs}
    assert account_commands(settings, name, accounts, assocs) == ()  # applied once, nothing left to do

    fewer = Settings(cluster=settings.cluster, organisations=settings.organisations, teams=settings.teams,
                     projects=MappingProxyType({"ci": settings.projects["ci"]}))
    for command in account_commands(fewer, name, accounts, assocs):
        cluster.run("sacctmgr", *command)
    names = {a.name for a in current()[0]}
    assert "demo" not in names and {"ci", "physics"} <= names

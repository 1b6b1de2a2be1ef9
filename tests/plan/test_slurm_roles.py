"""Each node's part in Slurm (llmgw.plan.slurm_roles): who runs which daemon, the files they get, the slurmdbd
password derived from the munge key, and the planner sending a node its part again (CONFIGURE) when lending it
changes it."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from llmgw.plan import ActionKind, Fleet, agent_settings_fingerprint, make_plan
from llmgw.plan.slurm_conf import hosts_of
from llmgw.plan.slurm_roles import AGENT_PATHS, slurm_roles, slurmdbd_conf, storage_names, storage_password
from llmgw.settings.model import ClusterSettings, Settings
from llmgw.settings.slurm import SlurmNode, SlurmPartition, SlurmSettings
from plan_fleets import cpu_node, gpu_node

FLEET = Fleet((gpu_node("ctl", count=0), gpu_node("g1", count=2), gpu_node("g2", count=4), cpu_node("web")))


def slurm(*, lent: bool = False, accounting: bool = True, enabled: bool = True) -> SlurmSettings:
    return SlurmSettings(
        enabled=enabled, cluster_name="Lab-1", controller="ctl", accounting=accounting,
        nodes=MappingProxyType({"g1": SlurmNode("gpu", lent=lent), "g2": SlurmNode("gpu"), "absent": SlurmNode("gpu")}),
        partitions=MappingProxyType({"gpu": SlurmPartition(default=True)}))


def test_the_controller_runs_slurmdbd_and_slurmctld_and_lendable_nodes_run_slurmd() -> None:
    roles = slurm_roles(slurm(), hosts_of(FLEET))
    assert {node: role.daemons for node, role in roles.items()} == {
        "ctl": ("slurmdbd", "slurmctld"), "g1": ("slurmd",), "g2": ("slurmd",)}  # not web; absent is not reported
    assert roles["g1"].node_name == "g1" and roles["ctl"].node_name == ""
    assert roles["ctl"].accounting and not roles["g1"].accounting
    assert slurm_roles(slurm(accounting=False), hosts_of(FLEET))["ctl"].daemons == ("slurmctld",)
    assert slurm_roles(slurm(enabled=False), hosts_of(FLEET)) == {}


def test_every_node_gets_the_same_files_with_the_agents_placeholders() -> None:
    roles = slurm_roles(slurm(), hosts_of(FLEET))
    assert len({(r.slurm_conf, r.gres_conf) for r in roles.values()}) == 1
    conf = roles["g1"].slurm_conf
    assert f"StateSaveLocation={AGENT_PATHS.state_dir}" in conf and "@SLURM_USER@" in conf
    assert "NodeName=g2 " in conf and "absent" not in conf
    assert roles["g1"].gres_conf.count("File=/dev/nvidia") == 6


def test_lending_changes_only_that_nodes_part() -> None:
    before = slurm_roles(slurm(), hosts_of(FLEET))
    after = slurm_roles(slurm(lent=True), hosts_of(FLEET))
    assert after["g1"].lent and after["g1"].digest() != before["g1"].digest()
    assert after["g2"].digest() == before["g2"].digest() and after["ctl"].digest() == before["ctl"].digest()
    assert after["g1"].slurm_conf == before["g1"].slurm_conf  # lending resumes in Slurm, never rewrites the file


def test_slurmdbds_password_is_derived_from_the_munge_key() -> None:
    settings = slurm()
    key = bytes(range(64))
    password = storage_password(key, settings)
    assert password == storage_password(key, settings) and len(password) == 32
    assert password != storage_password(key[::-1], settings)
    assert storage_names(settings) == ("slurm_lab_1", "slurm_lab_1")
    conf = slurmdbd_conf(settings, hosts_of(FLEET), password)
    assert f"StoragePass={password}" in conf and "StorageLoc=slurm_lab_1" in conf and "DbdHost=ctl" in conf


def test_the_planner_configures_a_node_again_when_its_part_in_slurm_changes() -> None:
    settings = Settings(cluster=ClusterSettings(name="t"), slurm=slurm())
    plain = agent_settings_fingerprint(settings, "g1")
    nodes = tuple(replace(node, agent_settings_applied=plain) for node in FLEET.nodes)
    configured = {a.node_id: a.fingerprint for a in make_plan(settings, Fleet(nodes)).actions
                  if a.kind is ActionKind.CONFIGURE}
    assert set(configured) == {"ctl", "g1", "g2"}  # web has no part: its settings are the plain ones

    acknowledged = tuple(replace(node, agent_settings_applied=configured.get(node.node_id, plain)) for node in nodes)
    assert not [a for a in make_plan(settings, Fleet(acknowledged)).actions if a.kind is ActionKind.CONFIGURE]

    lent = replace(settings, slurm=slurm(lent=True))
    again = [a.node_id for a in make_plan(lent, Fleet(acknowledged)).actions if a.kind is ActionKind.CONFIGURE]
    assert again == ["g1"]


def test_containers_reach_every_node_and_the_export_goes_to_the_other_slurm_nodes_only() -> None:
    settings = replace(slurm(), containers="runc", shared_path="/srv/shared", shared_export="ctl")
    hosts = hosts_of(FLEET)
    roles = slurm_roles(settings, hosts)
    assert {r.containers for r in roles.values()} == {"runc"}
    assert roles["ctl"].nfs_clients == tuple(sorted({hosts["g1"].address, hosts["g2"].address}))
    assert roles["ctl"].nfs_server == "" and {roles["g1"].nfs_server, roles["g2"].nfs_server} == {hosts["ctl"].address}
    assert roles["g1"].nfs_clients == () and "web" not in roles  # a node outside Slurm is no client
    plain = slurm_roles(slurm(), hosts)
    assert all(r.containers == "none" and not r.nfs_clients and not r.nfs_server for r in plain.values())
    assert all(plain[n].digest() != roles[n].digest() for n in roles)
    unreported = slurm_roles(replace(settings, shared_export="g1"), hosts_of(Fleet(FLEET.nodes[:1])))
    assert unreported["ctl"].nfs_server == ""  # the exporting node is not reported yet: nothing to mount

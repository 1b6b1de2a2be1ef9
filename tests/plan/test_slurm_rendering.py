"""slurm.conf and gres.conf from the fleet (llmgw.plan.slurm_conf): invariants over 60 seeded random fleets, and
the exact text of a small one."""

from __future__ import annotations

import random
from types import MappingProxyType

import pytest

from llmgw.plan import Fleet
from llmgw.plan.slurm_conf import DRAIN_REASON, SlurmPaths, hosts_of, render_slurm
from llmgw.settings.slurm import SlurmNode, SlurmPartition, SlurmSettings
from plan_fleets import GiB, cpu_node, gpu_node

CLASSES = ("h100-80g", "a100-80g", "l40s-48g")


def random_case(seed: int) -> tuple[SlurmSettings, Fleet]:
    rng = random.Random(seed)
    nodes = []
    for index in range(rng.randint(1, 12)):
        node_id = f"node-{index:02d}"
        if rng.random() < 0.6:
            nodes.append(gpu_node(node_id, count=rng.randint(1, 8), gpu_class=rng.choice(CLASSES),
                                  cpu_cores=rng.choice((32, 63.5, 96)), memory=rng.choice((256, 1024)) * GiB,
                                  alive=rng.random() < 0.9))
        else:
            nodes.append(cpu_node(node_id, cores=rng.choice((4, 8.5, 16)), memory=rng.choice((16, 64)) * GiB))
    partitions = [f"p{i}" for i in range(rng.randint(1, 3))]
    lendable = {}
    for node in nodes + [cpu_node("absent-" + str(i)) for i in range(rng.randint(0, 2))]:
        if rng.random() < 0.7:
            lendable[node.node_id] = SlurmNode(rng.choice(partitions), lent=rng.random() < 0.5)
    slurm = SlurmSettings(
        enabled=True, controller=nodes[0].node_id, nodes=MappingProxyType(lendable),
        partitions=MappingProxyType({p: SlurmPartition(default=(p == "p0"), max_time_seconds=rng.choice((None, 90.0, 86400.0)))
                                     for p in partitions}),
        accounting=rng.random() < 0.5)
    shuffled = nodes[:]
    rng.shuffle(shuffled)
    return slurm, Fleet(tuple(shuffled))


def pairs(line: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in line.replace(f'"{DRAIN_REASON}"', "x").split())


@pytest.mark.parametrize("seed", range(60))
def test_every_lendable_node_the_fleet_reports_appears_once_in_its_partition_with_its_gpus(seed: int) -> None:
    slurm, fleet = random_case(seed)
    hosts = hosts_of(fleet)
    rendered = render_slurm(slurm, hosts)
    lines = rendered.slurm_conf.splitlines()
    node_lines = {pairs(line)["NodeName"]: pairs(line) for line in lines if line.startswith("NodeName=")}
    assert len(node_lines) == len([line for line in lines if line.startswith("NodeName=")])
    expected = {n for n in slurm.nodes if n in hosts}
    assert set(node_lines) == expected
    assert set(rendered.missing) == set(slurm.nodes) - expected
    members = {pairs(line)["PartitionName"]: pairs(line)["Nodes"].split(",")
               for line in lines if line.startswith("PartitionName=")}
    for node_id, entry in node_lines.items():
        node = fleet.node(node_id)
        assert [p for p, ids in members.items() if node_id in ids] == [slurm.nodes[node_id].partition]
        assert entry["State"] == "DRAIN" and entry["CPUs"] == str(int(node.cpu_cores))
        assert int(entry["RealMemory"]) == node.memory_bytes // 2**20
        gres = {} if "Gres" not in entry else {k: int(n) for _, k, n in (g.split(":") for g in entry["Gres"].split(","))}
        assert gres == ({node.gpus[0].gpu_class: len(node.gpus)} if node.gpus else {})
        devices = [line for line in rendered.gres_conf.splitlines() if line.startswith(f"NodeName={node_id} ")]
        assert sorted(line.rsplit("File=", 1)[1] for line in devices) == sorted(f"/dev/nvidia{g.device_id}" for g in node.gpus)
    assert all(ids for ids in members.values())
    assert ("GresTypes=gpu" in lines) == any(fleet.node(n).gpus for n in node_lines)


@pytest.mark.parametrize("seed", range(20))
def test_the_same_fleet_gives_byte_identical_files_whatever_its_order(seed: int) -> None:
    slurm, fleet = random_case(seed)
    again = Fleet(tuple(reversed(fleet.nodes)))
    assert render_slurm(slurm, hosts_of(fleet)) == render_slurm(slurm, hosts_of(again))


def test_a_small_fleet_renders_exactly() -> None:
    slurm = SlurmSettings(enabled=True, cluster_name="demo", controller="gpu-1",
                          nodes=MappingProxyType({"gpu-1": SlurmNode("gpu"), "cpu-2": SlurmNode("cpu", lent=True)}),
                          partitions=MappingProxyType({"gpu": SlurmPartition(True, 7 * 86400.0), "cpu": SlurmPartition()}),
                          accounting=True, proctrack_type="proctrack/linuxproc", task_plugin="task/none")
    fleet = Fleet((gpu_node("gpu-1", count=2, cpu_cores=63.5, memory=64 * GiB), cpu_node("cpu-2", cores=8, memory=16 * GiB)))
    rendered = render_slurm(slurm, hosts_of(fleet), SlurmPaths(munge_socket="/run/llmgw/munge.sock"))
    conf = rendered.slurm_conf
    assert "SlurmctldHost=gpu-1(10.0.0.1)\n" in conf and "ProctrackType=proctrack/linuxproc\n" in conf
    assert "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=10.0.0.1\n" in conf
    assert "AuthInfo=socket=/run/llmgw/munge.sock\n" in conf and "AccountingStoragePass=/run/llmgw/munge.sock\n" in conf
    assert conf.endswith(
        'NodeName=cpu-2 NodeAddr=127.0.0.1 CPUs=8 RealMemory=16384 State=DRAIN Reason="llmgw: not lent"\n'
        'NodeName=gpu-1 NodeAddr=10.0.0.1 CPUs=63 RealMemory=65536 Gres=gpu:h100-80g:2 State=DRAIN '
        'Reason="llmgw: not lent"\n\n'
        "PartitionName=gpu Nodes=gpu-1 Default=YES MaxTime=10080 State=UP\n"
        "PartitionName=cpu Nodes=cpu-2 Default=NO MaxTime=UNLIMITED State=UP\n")
    assert rendered.gres_conf.splitlines()[1:] == ["NodeName=gpu-1 Name=gpu Type=h100-80g File=/dev/nvidia0",
                                                   "NodeName=gpu-1 Name=gpu Type=h100-80g File=/dev/nvidia1"]
    assert rendered.missing == ()


@pytest.mark.parametrize("ports", [None, {"slurmctld": 7001, "slurmd": 7002, "slurmdbd": 7003}],
                         ids=["default-ports", "ports-of-slurm-yaml"])
def test_each_daemon_port_is_rendered_under_its_own_key(ports) -> None:
    """slurmd listens on SlurmdPort, slurmctld on SlurmctldPort, slurmdbd on DbdPort (AccountingStoragePort in
    slurm.conf); the defaults are Slurm's own 6817, 6818, 6819."""
    from llmgw.plan.slurm_conf import render_slurmdbd_conf

    expected = ports or {"slurmctld": 6817, "slurmd": 6818, "slurmdbd": 6819}
    extra = {"ports": MappingProxyType(ports)} if ports else {}
    slurm = SlurmSettings(enabled=True, cluster_name="demo", controller="gpu-1", accounting=True,
                          nodes=MappingProxyType({"gpu-1": SlurmNode("gpu")}),
                          partitions=MappingProxyType({"gpu": SlurmPartition(True)}), **extra)
    conf = render_slurm(slurm, hosts_of(Fleet((gpu_node("gpu-1", count=1),)))).slurm_conf.splitlines()
    assert [line for line in conf if line.split("=")[0].endswith("Port")] == [
        f"SlurmctldPort={expected['slurmctld']}", f"SlurmdPort={expected['slurmd']}",
        f"AccountingStoragePort={expected['slurmdbd']}"]
    dbd = render_slurmdbd_conf(slurm, storage_host="127.0.0.1", storage_port=3306, storage_user="slurm",
                               storage_password="pw", storage_database="slurm_acct_db", dbd_host="gpu-1",
                               dbd_address="10.0.0.1")
    assert f"DbdPort={expected['slurmdbd']}" in dbd.splitlines() and "StoragePort=3306" in dbd.splitlines()


def test_slurmdbd_conf_renders_exactly() -> None:
    from llmgw.plan.slurm_conf import render_slurmdbd_conf

    slurm = SlurmSettings(enabled=True, cluster_name="demo", controller="gpu-1", accounting=True,
                          nodes=MappingProxyType({"gpu-1": SlurmNode("gpu")}),
                          partitions=MappingProxyType({"gpu": SlurmPartition(True)}))
    paths = SlurmPaths(log_dir="/l", run_dir="/r", slurm_user="slurmy", munge_socket="/m/socket")
    dbd = render_slurmdbd_conf(slurm, storage_host="db", storage_port=3307, storage_user="acct",
                               storage_password="pw", storage_database="acct_db", dbd_host="gpu-1",
                               dbd_address="10.0.0.1", paths=paths)
    assert dbd.splitlines() == [
        "# Written by llmgw from slurm.yaml: edits here are overwritten.",
        "AuthType=auth/munge", "AuthInfo=socket=/m/socket", "DbdHost=gpu-1", "DbdAddr=10.0.0.1", "DbdPort=6819",
        "SlurmUser=slurmy", "PidFile=/r/slurmdbd.pid", "LogFile=/l/slurmdbd.log",
        "StorageType=accounting_storage/mysql", "StorageHost=db", "StoragePort=3307", "StorageUser=acct",
        "StoragePass=pw", "StorageLoc=acct_db"]
    assert "AuthInfo" not in render_slurmdbd_conf(
        slurm, storage_host="db", storage_port=3307, storage_user="acct", storage_password="pw",
        storage_database="acct_db", dbd_host="gpu-1", dbd_address="10.0.0.1")  # munge's default socket


def test_a_host_from_slurmd_c_numbers_its_typed_gpus_in_type_order() -> None:
    from llmgw.plan.slurm_conf import SlurmHost, gres_type, host_from_slurmd
    from llmgw.tools.slurm import SlurmdConfig

    config = SlurmdConfig(node_name="gpu-1.lab", cpus=64, boards=1, sockets_per_board=2, cores_per_socket=16,
                          threads_per_core=2, memory_mib=515_000, gpus={"l4": 1, "h100 80g": 2, "": 1})
    assert host_from_slurmd(config, "n1", "10.0.0.9") == SlurmHost(
        "n1", "10.0.0.9", 64, 515_000,
        (("gpu", "/dev/nvidia0"), ("h100_80g", "/dev/nvidia1"), ("h100_80g", "/dev/nvidia2"), ("l4", "/dev/nvidia3")),
        "gpu-1.lab")
    assert (gres_type(""), gres_type("a100/40GB"), gres_type("h-1_0")) == ("gpu", "a100_40GB", "h-1_0")


def test_a_node_with_gpus_of_several_classes_lists_each_class_in_its_gres() -> None:
    fleet = Fleet((gpu_node("gpu-1", count=1, gpu_class="h100-80g"),))
    hosts = hosts_of(fleet)
    host = hosts["gpu-1"]
    mixed = {"gpu-1": type(host)(host.node_id, host.address, host.cpus, host.memory_mib,
                                 (("a10", "/dev/nvidia0"), ("h100", "/dev/nvidia1"), ("h100", "/dev/nvidia2")))}
    slurm = SlurmSettings(enabled=True, cluster_name="demo", controller="gpu-1",
                          nodes=MappingProxyType({"gpu-1": SlurmNode("gpu")}),
                          partitions=MappingProxyType({"gpu": SlurmPartition(True)}))
    conf = render_slurm(slurm, mixed).slurm_conf
    assert "Gres=gpu:a10:1,gpu:h100:2" in conf


def test_a_host_leaves_out_ignored_gpus_numbers_devices_in_order_and_has_at_least_one_core() -> None:
    fleet = Fleet((gpu_node("gpu-1", count=12, cpu_cores=0.5, memory=3 * GiB),))
    host = hosts_of(fleet, {"gpu-1": ["1"], "other": ["0"]})["gpu-1"]
    assert (host.node_id, host.cpus, host.memory_mib) == ("gpu-1", 1, 3072)
    assert [device for _, device in host.gpus] == [f"/dev/nvidia{n}" for n in (0, *range(2, 12))]

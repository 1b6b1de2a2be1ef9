"""slurm.yaml (issue 15): the typed model, and each bad input an error at file:line:column from `llmgw validate`."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.errors import SettingsError
from llmgw.settings import load_directory
from llmgw.settings.slurm import SlurmNode, SlurmPartition
from settings_trees import copy_example

HEAD = "enabled: false\ncontroller: gpu-node-01\n"

# case -> (slurm.yaml text, where, a fragment of the reason)
BAD = {
    "lendable node not in the fleet": (
        HEAD + "nodes:\n  gpu-node-01: {partition: gpu}\n  gpu-node-99: {partition: gpu}\npartitions:\n  gpu: {}\n",
        "slurm.yaml:5:3", "node 'gpu-node-99' may be lent but is not in the fleet"),
    "controller not in the fleet": (
        "enabled: false\ncontroller: elsewhere\n", "slurm.yaml:2:13", "node 'elsewhere' is not in the fleet"),
    "two controllers as a list": (
        "enabled: false\ncontroller: [gpu-node-01, gpu-node-02]\n", "slurm.yaml:2:13",
        "Slurm here has exactly one controller"),
    "two controllers as two keys": (
        "enabled: false\ncontroller: gpu-node-01\ncontroller: gpu-node-02\n", "slurm.yaml:3:1",
        "duplicate key 'controller'"),
    "partition with no nodes": (
        HEAD + "nodes:\n  gpu-node-01: {partition: gpu}\npartitions:\n  gpu: {}\n  cpu: {}\n",
        "slurm.yaml:7:3", "partition 'cpu' has no nodes"),
    "node in an undefined partition": (
        HEAD + "nodes:\n  gpu-node-01: {partition: h100}\n", "slurm.yaml:4:28",
        "partition 'h100' is not among `partitions`"),
    "users llmgw without a shared path": (
        HEAD + "users: llmgw\n", "slurm.yaml:3:8", "users: llmgw needs a shared_path"),
    "two default partitions": (
        HEAD + "nodes:\n  gpu-node-01: {partition: a}\n  gpu-node-02: {partition: b}\npartitions:\n"
        "  a: {default: true}\n  b: {default: true}\n", "slurm.yaml:8:16", "both the default"),
    "unknown users value": (HEAD + "users: everyone\n", "slurm.yaml:3:8", "'everyone' is not one of"),
    "shared.export without a shared path": (
        HEAD + "shared:\n  export: gpu-node-01\n", "slurm.yaml:4:11", "shared.export needs a shared_path"),
    "shared.export from a node outside Slurm": (
        HEAD + "shared_path: /srv\nshared:\n  export: gpu-node-02\n", "slurm.yaml:5:11",
        "neither the controller nor a lendable node"),
    "unknown container runtime": (HEAD + "containers: docker\n", "slurm.yaml:3:13", "'docker' is not one of"),
    "an ssh key with options or a line break": (
        HEAD + "users: llmgw\nshared_path: /srv\nssh_keys:\n  ada@x: ['command=\"sh\" ssh-ed25519 AAAA ada']\n",
        "slurm.yaml:6:11", "does not match"),
}


def _tree(tmp_path: Path, slurm_text: str) -> Path:
    tree = copy_example(tmp_path / "settings")
    (tree / "agents" / "nodes" / "gpu-node-02.yaml").write_text("{}\n")
    (tree / "slurm.yaml").write_text(slurm_text)
    return tree


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_slurm_settings_fail_validation_at_file_and_line(case: str, tmp_path: Path) -> None:
    text, where, reason = BAD[case]
    result = CliRunner().invoke(cli, ["validate", str(_tree(tmp_path, text))])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if not line.endswith(" error") and "errors" not in line
              and "warning:" not in line]
    assert len(errors) == 1, result.output
    assert errors[0].startswith(where + ":"), result.output
    assert reason in errors[0], result.output


def test_the_example_slurm_settings_load_typed(tmp_path: Path) -> None:
    slurm = load_directory(copy_example(tmp_path / "s")).slurm
    assert slurm.controller == "gpu-node-01" and slurm.cluster_name == "demo"
    assert dict(slurm.nodes) == {"gpu-node-01": SlurmNode("gpu")}
    assert dict(slurm.partitions) == {"gpu": SlurmPartition(default=True, max_time_seconds=7 * 86400.0)}
    assert slurm.users == "none" and slurm.shared_path == "/mnt/shared" and not slurm.accounting
    assert slurm.ports == {"slurmctld": 6817, "slurmd": 6818, "slurmdbd": 6819}
    assert slurm.lent == frozenset()


def test_a_lent_node_is_listed_as_lent(tmp_path: Path) -> None:
    text = HEAD + "nodes:\n  gpu-node-01: {partition: gpu, lent: true}\n  gpu-node-02: {partition: gpu}\n" \
                  "partitions:\n  gpu: {}\n"
    assert load_directory(_tree(tmp_path, text)).slurm.lent == {"gpu-node-01"}


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx3WnJ0b2tlbi1mb3ItdGVzdHMtb25seS0wMDAwMDAw ada@laptop"


def test_users_llmgw_with_keys_loads_typed_without_warnings_and_keys_of_no_member_are_a_warning(
        tmp_path: Path) -> None:
    text = ("enabled: true\ncontroller: gpu-node-01\nnodes:\n  gpu-node-01: {partition: gpu}\npartitions:\n"
            f"  gpu: {{}}\naccounting: true\nusers: llmgw\nshared_path: /srv/home\nssh_keys:\n  ada@lab.example: ['{KEY}']\n"
            f"  ghost@lab.example: ['{KEY}']\n")
    tree = _tree(tmp_path, text)
    projects = tree / "projects.yaml"
    projects.write_text(projects.read_text().replace("          ci:\n", "          ci:\n            members: [ada@lab.example]\n"))
    settings = load_directory(tree)
    assert dict(settings.slurm.ssh_keys) == {"ada@lab.example": (KEY,), "ghost@lab.example": (KEY,)}
    warnings = [str(w) for w in settings.warnings if w.file == "slurm.yaml"]
    assert [w.split(": warning")[0] for w in warnings] == ["slurm.yaml:12:3: ssh_keys.ghost@lab.example"]
    assert "is a member of no project in projects.yaml" in warnings[0]
    text = text.replace("users: llmgw\n", "")
    warnings = [str(w) for w in load_directory(_tree(tmp_path / "b", text)).warnings if w.file == "slurm.yaml"]
    assert any("ssh_keys are written only for users llmgw makes" in w for w in warnings)


@pytest.mark.parametrize("key", ["cordoned", "drained"])
def test_cordoned_and_drained_nodes_the_settings_do_not_name_get_a_warning(key: str, tmp_path: Path) -> None:
    tree = copy_example(tmp_path / "s")
    llmgw = tree / "llmgw.yaml"
    llmgw.write_text(llmgw.read_text().replace("  allow_empty: false", f"  allow_empty: false\n  {key}: [gpu-node-01, ghost]"))
    [warning] = [w for w in load_directory(tree).warnings if "ghost" in str(w)]
    assert str(warning).startswith("llmgw.yaml:23:") and "no agents/nodes/ghost.yaml" in str(warning)
    llmgw.write_text(llmgw.read_text().replace(", ghost]", "]"))
    cluster = load_directory(tree).cluster
    assert getattr(cluster, key) == ("gpu-node-01",)


def test_containers_and_the_shared_export_load_typed(tmp_path: Path) -> None:
    tree = _tree(tmp_path, HEAD + "nodes:\n  gpu-node-02: {partition: gpu}\npartitions:\n  gpu: {}\n"
                 "shared_path: /srv/shared\nshared:\n  export: gpu-node-01\ncontainers: runc\n")
    slurm = load_directory(tree).slurm
    assert (slurm.containers, slurm.shared_export, slurm.shared_path) == ("runc", "gpu-node-01", "/srv/shared")
    plain = load_directory(_tree(tmp_path / "plain", HEAD)).slurm
    assert (plain.containers, plain.shared_export) == ("none", "")

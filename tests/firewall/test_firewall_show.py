"""`llmgw firewall show NODE`: the table llmgw keeps on a node, from a settings directory and a fleet snapshot."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.plan.snapshot import FleetSnapshot, snapshot_to_json
from llmgw.plan.types import Fleet, NodeState

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"


def setup(tmp_path: Path, enabled: bool) -> tuple[Path, Path]:
    settings = tmp_path / "settings"
    shutil.copytree(EXAMPLE, settings)
    if enabled:
        path = settings / "firewall.yaml"
        path.write_text(path.read_text().replace("enabled: false", "enabled: true"))
    fleet = Fleet((NodeState("cp", "10.20.0.10"), NodeState("gpu-node-01", "10.20.0.21", labels=(("pool", "gpu"),)),
                   NodeState("far", "far.example")))
    snapshot = tmp_path / "fleet.json"
    snapshot.write_text(json.dumps(snapshot_to_json(FleetSnapshot(fleet))))
    return settings, snapshot


def test_show_prints_a_nodes_table_that_nft_accepts(tmp_path: Path) -> None:
    settings, snapshot = setup(tmp_path, enabled=True)
    result = CliRunner().invoke(cli, ["firewall", "show", "gpu-node-01", "--settings", str(settings), "--fleet",
                                      str(snapshot)])
    assert result.exit_code == 0, result.output
    head, text = result.stdout.split("\n", 1)
    assert head.startswith("# node gpu-node-01: table inet llmgw, digest ")
    assert 'tcp dport 20000-20999 accept comment "rule nccl-tests"' in text  # its node group: pool gpu
    assert "warning: node far's address is not an IP address" in result.stderr
    checked = subprocess.run(["nft", "-c", "-f", "-"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    cp = CliRunner().invoke(cli, ["firewall", "show", "cp", "--settings", str(settings), "--fleet", str(snapshot)])
    assert 'tcp dport 8082 accept comment "agents"' in cp.stdout and "nccl-tests" not in cp.stdout


def test_show_says_when_the_firewall_is_off_and_names_an_unknown_node(tmp_path: Path) -> None:
    settings, snapshot = setup(tmp_path, enabled=False)
    off = CliRunner().invoke(cli, ["firewall", "show", "cp", "--settings", str(settings), "--fleet", str(snapshot)])
    assert off.exit_code == 0 and "firewall.yaml is off" in off.stdout
    unknown = CliRunner().invoke(cli, ["firewall", "show", "nope", "--settings", str(settings), "--fleet", str(snapshot)])
    assert unknown.exit_code != 0 and "node 'nope' is not in the fleet" in str(unknown.exception)

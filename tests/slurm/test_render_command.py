"""`llmgw slurm render`: the files llmgw writes for a settings tree and a node's `slurmd -C`, or a fleet snapshot."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.plan import Fleet
from llmgw.plan.snapshot import FleetSnapshot, snapshot_to_json

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cluster-repo"
SLURMD_C = ROOT / "tests" / "fixtures" / "slurm-22.05" / "slurmd_C.txt"


def test_render_writes_slurm_conf_for_the_example_from_slurmd_c(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["slurm", "render", str(EXAMPLE), "--slurmd-c", str(SLURMD_C), "--out",
                                      str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    conf = (tmp_path / "out" / "slurm.conf").read_text()
    assert "SlurmctldHost=vm(127.0.0.1)\n" in conf
    assert ('NodeName=gpu-node-01 NodeAddr=127.0.0.1 NodeHostname=vm CPUs=2 RealMemory=24105 State=DRAIN '
            'Reason="llmgw: not lent"\n') in conf
    assert "PartitionName=gpu Nodes=gpu-node-01 Default=YES MaxTime=10080 State=UP\n" in conf


def test_render_from_a_fleet_that_lacks_the_node_warns_and_leaves_it_out(tmp_path: Path) -> None:
    snapshot = tmp_path / "fleet.json"
    snapshot.write_text(json.dumps(snapshot_to_json(FleetSnapshot(Fleet(())))))
    result = CliRunner().invoke(cli, ["slurm", "render", str(EXAMPLE), "--fleet", str(snapshot)])
    assert result.exit_code == 0, result.output
    assert "warning: gpu-node-01 may be lent (slurm.yaml) but the fleet does not report it" in result.output
    assert "NodeName=" not in result.output.split("# gres.conf")[0].replace("# slurm.conf", "")

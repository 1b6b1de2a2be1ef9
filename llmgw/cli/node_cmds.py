"""`llmgw node doctor`: what this node has and whether it can serve (see `llmgw.agent.doctor`).

Attaches `doctor` to the `node` group `llmgw.cli.agent_cmds` defines (`node join`), creating the group when that
module is absent. Exit status 1 when a check failed (warnings alone exit 0).
"""

from __future__ import annotations

import json
from pathlib import Path

import click


def register(group: click.Group) -> None:
    """Add `node doctor` to the `llmgw` command."""
    node_group = group.commands.get("node")
    if not isinstance(node_group, click.Group):
        @group.group("node")
        def node_group_command() -> None:
            """This node: checks and joining the fleet."""

        node_group = node_group_command

    @node_group.command("doctor")
    @click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
    @click.option("--weights-dir", type=click.Path(path_type=Path), default=None,
                  help="Where weights are kept (default: <state-dir>/weights).")
    @click.option("--engines-dir", type=click.Path(path_type=Path), default=None,
                  help="Where engines are installed (default: <state-dir>/engines).")
    @click.option("--state-dir", type=click.Path(path_type=Path), default=None,
                  help="The agent's state directory (default: $LLMGW_STATE/agent or ~/.local/state/llmgw/agent).")
    @click.option("--cert", "cert_path", type=click.Path(path_type=Path), default=None,
                  help="A node certificate to check (e.g. <state-dir>/tls/node.crt).")
    def doctor_command(as_json: bool, weights_dir: Path | None, engines_dir: Path | None, state_dir: Path | None,
                       cert_path: Path | None) -> None:
        """Discover this node (CPUs, memory, GPUs, MIG, NVLink, fabrics) and check what serving needs."""
        from llmgw.agent.config import default_state_dir
        from llmgw.agent.doctor import run_doctor

        state = state_dir or default_state_dir()
        report = run_doctor(weights_dir or state / "weights", engines_dir=engines_dir, state_dir=state,
                            cert_path=cert_path)
        if as_json:
            click.echo(json.dumps(report.to_json(), indent=2))
        else:
            click.echo(report.render())
        if not report.ok:
            raise click.exceptions.Exit(1)

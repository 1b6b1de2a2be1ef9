"""`llmgw node doctor` (what this node has and whether it can serve, see `llmgw.agent.doctor`) and
`llmgw node revoke ID` (on the control plane: revoke a node's certificates, see `llmgw.wire.tls`) and
`llmgw node forget-identity ID` (on the control plane: let a node with a new node secret in, see
`llmgw.control.node_identity`).

Attaches both to the `node` group (`node_group`, which `llmgw.cli.agent_cmds` and `llmgw.cli.slurm_cmds` share). `doctor --from DIR` reads captured tool output instead (`llmgw.agent.doctor_capture`). `doctor` exits 1 when a check failed (warnings alone exit 0); `revoke` exits 1 when there is no CA.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from llmgw.cli.ca_cmds import state_options
from llmgw.cli.credentials import remember_store, store_options, with_store
from llmgw.cli.server_cmds import bandwidth_line


def node_group(group: click.Group) -> click.Group:
    """The `node` group of `group`, added when it has none yet: agent_cmds (join), this module (doctor, revoke) and
    slurm_cmds (cordon, uncordon, drain) each add their verbs to it."""
    found = group.commands.get("node")
    if isinstance(found, click.Group):
        return found

    @group.group("node")
    def node() -> None:
        """Nodes: install one over ssh (add) and take it off again (remove), join the fleet (join), check what its
        agent finds (doctor), revoke its certificates (revoke), let it in with a new node secret (forget-identity),
        keep replicas off it (cordon, uncordon, drain)."""

    return node


def register(group: click.Group) -> None:
    """Add `node doctor`, `node revoke` and `node forget-identity` to the `llmgw` command."""
    node = node_group(group)

    @node.command("doctor")
    @click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
    @click.option("--weights-dir", type=click.Path(path_type=Path), default=None,
                  help="Where weights are kept (default: <state-dir>/weights).")
    @click.option("--engines-dir", type=click.Path(path_type=Path), default=None,
                  help="Where engines are installed (default: <state-dir>/engines).")
    @click.option("--state-dir", type=click.Path(path_type=Path), default=None,
                  help="The agent's state directory (default: $LLMGW_STATE/agent; else ./.state/agent when "
                       "`llmgw up` made it here; else ~/.local/state/llmgw/agent).")
    @click.option("--cert", "cert_path", type=click.Path(path_type=Path), default=None,
                  help="A node certificate to check (e.g. <state-dir>/tls/node.crt).")
    @click.option("--from", "from_dir", type=click.Path(path_type=Path), default=None,
                  help="Read a directory of captured tool output instead of running the tools "
                       "(docs/doctor-captures.md): devices, fabrics and warnings as the agent would conclude.")
    @click.option("--bandwidth", is_flag=True,
                  help="Also measure this machine's memory read bandwidth (one core, all cores; about a second) "
                       "and the decode speed it gives a dense model of 1 GB (docs/capacity.md).")
    @click.option("--min-free", "min_free", default=None, metavar="SIZE",
                  help="Fail when less than SIZE (e.g. 20Gi) is free under the weights directory (`llmgw node add "
                       "--min-disk`); without it, too little is a warning.")
    @click.option("--installable", is_flag=True,
                  help="Only check whether engines and weights can be installed now: the agent has its settings and "
                       "reads every mirror they name (quick; `llmgw node add` waits for it).")
    def doctor_command(as_json: bool, weights_dir: Path | None, engines_dir: Path | None, state_dir: Path | None,
                       cert_path: Path | None, from_dir: Path | None, bandwidth: bool, min_free: str | None,
                       installable: bool) -> None:
        """Discover this node (CPUs, memory, GPUs, MIG, NVLink, fabrics) and check what serving needs."""
        from llmgw.agent.config import default_state_dir
        from llmgw.agent.doctor import run_doctor

        if installable:
            from llmgw.agent.doctor_install import install_checks, render

            checks = install_checks(state_dir or _doctor_state_dir(default_state_dir()))
            click.echo(json.dumps({"ok": all(c.status.value != "fail" for c in checks),
                                   "checks": [c.to_json() for c in checks]}) if as_json else render(checks))
            if any(c.status.value == "fail" for c in checks):
                raise click.exceptions.Exit(1)
            return

        if bandwidth and from_dir is not None:
            from llmgw.errors import UsageError

            raise UsageError("--bandwidth measures this machine, --from reads captures of another: give one of them")
        if from_dir is not None:
            from llmgw.agent.doctor_capture import doctor_from

            report = doctor_from(from_dir)
            click.echo(json.dumps(report.to_json(), indent=2) if as_json else report.render())
            if not report.ok:
                raise click.exceptions.Exit(1)
            return
        state = state_dir or _doctor_state_dir(default_state_dir())
        weights = weights_dir or state / "weights"
        report = run_doctor(weights, engines_dir=engines_dir, state_dir=state, cert_path=cert_path,
                            min_free_bytes=_size(min_free, "--min-free") if min_free else None)
        measured = _bandwidth() if bandwidth else None
        if as_json:
            click.echo(json.dumps({**report.to_json(), **({"memory_bandwidth": measured} if measured else {})},
                                  indent=2))
        else:
            click.echo(f"agent state {state}\nweights     {weights}\nengines     {engines_dir or state / 'engines'}\n")
            click.echo(report.render())
            if measured:
                click.echo(f"{bandwidth_line(measured)}; a dense model of 1 GB: about "
                           f"{measured['gigabyte_model_tokens_per_second']:.1f} tokens/s")
        if not report.ok:
            raise click.exceptions.Exit(1)

    @node.command("revoke")
    @click.argument("node_id")
    @state_options
    def revoke_command(node_id: str, state_dir: Path, ca_dir: Path | None) -> None:
        """Revoke every certificate of NODE_ID issued until now (run on the control plane's machine).

        The agents' server refuses the node within a second, open streams included. The node can join again with
        a new join token (`llmgw join-token`); a Join under an id that still holds a live certificate is refused,
        so revoking is also how a node that lost its key is let back in.
        """
        from llmgw.cli.ca_cmds import existing_ca_directory
        from llmgw.wire import CertificateAuthority
        from llmgw.wire.tls import NODES_FILE

        directory = existing_ca_directory(state_dir, ca_dir)
        count = CertificateAuthority.load_or_create(directory).revoke(node_id)
        if count:
            click.echo(f"revoked {count} certificate{'s' if count != 1 else ''} of node {node_id!r} "
                       f"(recorded in {directory / NODES_FILE}); the control plane refuses it within a second")
        else:
            click.echo(f"no live certificate of node {node_id!r} is on record in {directory / NODES_FILE} (check "
                       f"the id with `llmgw nodes`); any certificate issued to it until now is refused all the same",
                       err=True)


    @node.command("forget-identity")
    @click.argument("node_id")
    @store_options
    @click.pass_context
    def forget_identity_command(ctx: click.Context, node_id: str, state_dir: str | None, store_url: str | None) -> None:
        """Forget the node secret NODE_ID proved itself with (run on the control plane's machine, or give its
        store): its next Register records a new one. For a node whose state directory was lost or replaced; until
        then the control plane refuses it ("already known with another node secret"). Any machine that
        registers as NODE_ID first is then taken for it: stop the old one first, start the new one right after.
        """
        from llmgw.control.node_identity import NodeIdentities

        remember_store(ctx, state_dir, store_url)
        if with_store(ctx, lambda store: NodeIdentities(store).forget(node_id)):
            click.echo(f"forgot the node secret of node {node_id!r}; its next Register records a new one")
        else:
            click.echo(f"no node secret of node {node_id!r} is recorded (check the id with `llmgw nodes`); its next "
                       "Register records one", err=True)


def _size(text: str, option: str) -> int:
    """Bytes of a size option ("20Gi"). Raises UsageError naming `option`."""
    from llmgw.errors import UsageError
    from llmgw.units import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise UsageError(f"{option} {text!r} is not a size ({exc}): write e.g. 20Gi") from exc


def _bandwidth() -> dict:
    """This machine's memory bandwidth (`llmgw.agent.bandwidth`) as JSON, with the decode speed all its cores give
    a dense model of 1 GB (`llmgw.plan.cpu_speed`)."""
    from llmgw.agent.bandwidth import probe_memory_bandwidth
    from llmgw.plan.cpu_speed import estimate_decode_tokens_per_second

    measured = probe_memory_bandwidth()
    return {**measured.to_json(), "gigabyte_model_tokens_per_second": estimate_decode_tokens_per_second(
        10**9, measured.all_cores_bytes_per_second)}


def _doctor_state_dir(default: Path) -> Path:
    """The agent state directory `node doctor` checks when none is given: `default` (`$LLMGW_STATE/agent` or
    ~/.local/state/llmgw/agent), except that without $LLMGW_STATE, `llmgw up`'s ./.state/agent wins when it is here."""
    local = Path(".state") / "agent"
    if not os.environ.get("LLMGW_STATE") and local.is_dir():
        return local.resolve()
    return default

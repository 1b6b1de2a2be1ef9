"""`llmgw ca rotate` (on the control plane's machine): a new agents' CA beside the old one, agents moved onto it over
their streams, the old one retired (`llmgw.wire.tls`, `llmgw.control.ca_rotation`).

Works on the CA's files (`<state>/ca/`) as `llmgw node revoke` does; a running control plane notices within a second.
"""

from __future__ import annotations

import time
from pathlib import Path

import click


def existing_ca_directory(state_dir: Path, ca_dir: Path | None) -> Path:
    """The CA directory given (`--ca-dir`, else `<state>/ca`), checked to hold a CA. Raises UsageError saying which
    option to give when it holds none."""
    from llmgw.errors import UsageError
    from llmgw.wire.tls import CA_CERT_FILE, CA_KEY_FILE

    directory = ca_dir or state_dir / "ca"
    if not (directory / CA_CERT_FILE).is_file() or not (directory / CA_KEY_FILE).is_file():
        raise UsageError(f"{directory} holds no CA ({CA_CERT_FILE}, {CA_KEY_FILE}): give the state directory of "
                         "`llmgw server --tls` with --state, or the CA directory with --ca-dir.")
    return directory


def state_options(command):
    """--state and --ca-dir, as `llmgw node revoke` takes them."""
    command = click.option("--ca-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                           help="The control plane's CA directory [default: <state>/ca].")(command)
    return click.option("--state", "state_dir", envvar="LLMGW_STATE", default=".state", show_default=True,
                        type=click.Path(file_okay=False, path_type=Path),
                        help="The control plane's state directory (`llmgw server --tls --state`).")(command)


def register(group: click.Group) -> None:
    """Add `ca rotate` to the `llmgw` command."""

    @group.group("ca")
    def ca() -> None:
        """The agents' certificate authority of a control plane started with --tls."""

    @ca.command("rotate")
    @state_options
    @click.option("--finish", is_flag=True,
                  help="Retire the old CA now, even if nodes still hold only its certificates (they join again).")
    def rotate_command(state_dir: Path, ca_dir: Path | None, finish: bool) -> None:
        """Put a new CA beside the old one; agents move onto it without an outage (run on the control plane).

        The running control plane notices within a second: it trusts both CAs, hands agents both, and has each agent
        renew its certificate under the new CA over its stream at once. Once every node (each connected one, and
        each holding a live certificate of the old CA on record) holds a certificate of the new CA, the old CA is
        retired: its certificates are refused from then on. `llmgw status` shows the progress. --finish retires it
        at once; the nodes still waiting must then join again.
        """
        from llmgw.wire import CertificateAuthority

        directory = existing_ca_directory(state_dir, ca_dir)
        authority = CertificateAuthority.load_or_create(directory)
        if finish:
            progress = authority.rotation_progress()
            authority.retire()
            waiting = progress["waiting"] if progress else []
            click.echo(f"retired the old CA in {directory}; the control plane trusts only the new one within a second"
                       + (f". Nodes that hold no certificate of the new CA must join again: {', '.join(waiting)}"
                          if waiting else ""))
            return
        authority.rotate()
        until = time.strftime("%Y-%m-%d", time.gmtime(authority.next_not_after or 0))
        click.echo(f"made a new CA (valid until {until}) beside the old one in {directory}; the control plane hands "
                   "it to agents within a second, each renews its certificate under it, and the old CA is retired "
                   "once every node holds one (`llmgw status` shows the progress). With several control planes, "
                   "copy this directory to each of them now (docs/ha.md).")

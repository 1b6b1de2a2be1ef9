"""`llmgw firewall show NODE`: the nftables table `inet llmgw` llmgw keeps on NODE, as the control plane renders it
(llmgw.plan.firewall) from the settings and the fleet.

The settings are a directory or a revision of the settings repository (`--settings`, default `main` of the
repository around the current directory, or of `--repo`); the fleet is the live one (`--admin`, as `llmgw fleet
snapshot` reads it) or a snapshot file (`--fleet`). The table is printed as nft text after a comment line naming
the node and the digest its agent acknowledges; `nft -c -f` can check it, and `nft list table inet llmgw` on the
node shows what is applied there.
"""

from __future__ import annotations

from pathlib import Path

import click

from llmgw.errors import UsageError


@click.group("firewall")
def firewall_group() -> None:
    """Each node's nftables table `inet llmgw` (firewall.yaml)."""


@firewall_group.command("show")
@click.argument("node")
@click.option("--settings", "target", default="main", show_default=True,
              help="A settings directory, or a revision of the settings repository.")
@click.option("--repo", default=None, help="The settings repository [default: the one around the current directory].")
@click.option("--fleet", "fleet_file", type=click.Path(path_type=Path), default=None,
              help="A fleet snapshot (`llmgw fleet snapshot`) instead of the live fleet.")
@click.option("--admin", "url", default=None, help="Admin API to read the live fleet from [default: "
              "$LLMGW_ADMIN_URL or <state>/admin-url].")
@click.option("--token", default=None, help="Token for --admin [default: $LLMGW_ADMIN_TOKEN or <state>/admin-token].")
@click.option("--state", "state_dir", type=click.Path(path_type=Path), default=None,
              help="State directory of a local `llmgw up` / `llmgw server` [default: $LLMGW_STATE or .state].")
def show_cmd(node: str, target: str, repo: str | None, fleet_file: Path | None, url: str | None, token: str | None,
             state_dir: Path | None) -> None:
    """Print the firewall table of NODE."""
    from llmgw.cli.review_cmds import _fleet, _load_settings
    from llmgw.control.reports import fleet_for
    from llmgw.plan.firewall import firewall_table

    settings = _load_settings(target, repo)
    snapshot, source = _fleet(fleet_file, url, token, state_dir)
    fleet = fleet_for(snapshot.fleet, settings)
    if fleet.node(node) is None:
        known = ", ".join(n.node_id for n in fleet.nodes) or "none"
        raise UsageError(f"node {node!r} is not in the fleet of {source} (nodes: {known})")
    table = firewall_table(settings, fleet, node)
    if table is None:
        click.echo("# firewall.yaml is off (enabled: false): llmgw keeps no table on any node")
        return
    for other in table.unknown:
        click.echo(f"warning: node {other}'s address is not an IP address: it is in none of the table's sets",
                   err=True)
    click.echo(f"# node {node}: table inet llmgw, digest {table.digest} (settings {settings.commit or target}, "
               f"fleet from {source})")
    click.echo(table.text, nl=False)


def register(group: click.Group) -> None:
    """Add firewall (show) to the `llmgw` command group."""
    group.add_command(firewall_group)

"""`llmgw node remove NODE`: take a node out of the fleet and llmgw off its machine.

    llmgw node remove NODE [--drain-timeout SECONDS] [--force] [--keep-weights] [--keep-machine]
                      [--over-ssh [--host HOST] [--user U] [--port P] [--ssh-key FILE] [--ssh-config FILE]]
                      [--url URL --token T | --state DIR]

In order, each step shown as it goes:

1. drain: `llmgw node drain NODE` (a settings commit as you): its replicas are placed elsewhere first, then
   stopped there. It waits until the node serves no shard (`--drain-timeout`, default DRAIN_TIMEOUT). A node that
   still serves then is refused, in so many words, and nothing else is done (it stays drained): wait and run it
   again, or `--force` to go on all the same (its requests in flight fail).
2. wipe, over the agent's own stream: POST /api/v1/nodes/NODE/wipe; the control plane sends its agent WipeNode
   (llmgw.control.node_wiping), the agent stops its engines, undoes everything the host's install journal lists (the
   code `llmgw wipe` runs: llmgw.install.wiping), answers with what it removed (shown as `[NODE] ...` lines) and
   stops itself. No ssh is needed. A node whose agent is not connected is refused with what to do: `--over-ssh`
   then wipes it over ssh to HOST (default: NODE; the options of `llmgw node add`) with the installed release's
   `llmgw wipe --yes --stop-agent` (a host with no llmgw installed is said so and passed). `--keep-machine` leaves
   the machine alone (gone, or not reachable any more); `--keep-weights` keeps its weights directories.
3. forget: POST /api/v1/nodes/NODE/forget once its agent's stream has ended: every certificate of the node revoked
   (mutual TLS), its node secret forgotten and its record dropped from the fleet, so that machine is not let in
   again without a new join token (`llmgw node add` again makes it a node anew).

The settings keep the node drained (`llmgw node uncordon NODE` lets a new node of that id serve). Exit status 0
removed, 1 refused or failed (the message says what was done and what is left).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import click

from llmgw.cli.node_add import admin_options, ssh_argv, ssh_options
from llmgw.errors import InstallError, UsageError

DRAIN_TIMEOUT = 300.0
"""Seconds `node remove` waits for the node's replicas to be placed elsewhere and stopped there."""
DISCONNECT_TIMEOUT = 30.0
"""Seconds it waits, once the agent was stopped, for the control plane to see its stream end."""
WIPE = "/opt/llmgw/current/bin/llmgw"
"""The installed release's llmgw on a node that `llmgw node add` made (llmgw.install.onboarding)."""


def serving_shards(status: dict, node: str) -> list[str]:
    """The shards of llmgw's `node` still runs (any state but stopped or failed; engines llmgw did not start left
    out), as "SHARD (replica R, STATE)", from the status document (GET /api/v1/status); empty when it serves none
    (or is not in it)."""
    shards = status.get("nodes", {}).get(node, {}).get("shards", {})
    return [f"{shard_id} (replica {shard.get('replica', '?')}, {shard.get('state', '?')})"
            for shard_id, shard in sorted(shards.items())
            if shard.get("state") not in ("stopped", "failed") and not shard.get("foreign")]


def _poll(client, node: str, done, timeout: float) -> tuple[bool, dict]:
    """Poll the status document every 0.5 s until `done(status)` or `timeout` seconds; (done, last status)."""
    deadline = time.monotonic() + timeout
    while True:
        status = client.get("/api/v1/status")
        if done(status) or time.monotonic() >= deadline:
            return done(status), status
        time.sleep(0.5)


def _wipe_over_ssh(node: str, ssh: list[str], keep_weights: bool) -> None:
    """Run the installed release's `llmgw wipe --yes --stop-agent` on the host, its lines shown as they come.
    Raises InstallError in the host's words when ssh or the wipe fails."""
    keep = " --keep-weights" if keep_weights else ""
    command = (f"if [ -x {WIPE} ]; then exec {WIPE} wipe --yes --stop-agent{keep}; else echo 'no llmgw installed "
               "here'; fi")
    done = subprocess.run([*ssh, command], capture_output=True, text=True, timeout=600)
    for line in done.stdout.splitlines():
        click.echo(f"[{node}] {line}")
    if done.returncode:
        words = (done.stderr or done.stdout).strip().splitlines()
        where = "ssh to the host" if done.returncode == 255 and not done.stdout else "wiping the host"
        raise InstallError(f"{where} failed: {words[-1] if words else f'exit status {done.returncode}'}. The node "
                           f"stays drained and known to the control plane: fix that and run `llmgw node remove "
                           f"{node}` again (or --keep-machine when the machine is gone)")


def _wipe_over_stream(client, node: str, keep_weights: bool) -> None:
    """Have the node's agent wipe its machine (POST /api/v1/nodes/NODE/wipe) and show what it removed.
    Raises UsageError (not connected, or the agent refused: the control plane's words) or TemporaryError."""
    answer = client.post(f"/api/v1/nodes/{node}/wipe", {"keep_weights": keep_weights})
    for line in answer.get("report", []):
        click.echo(f"[{node}] {line}")


@click.command("remove")
@click.argument("node")
@click.option("--over-ssh", is_flag=True, help="Wipe the machine over ssh (`llmgw wipe --stop-agent` there) instead "
              "of over its agent's stream: for a node whose agent is not connected.")
@click.option("--host", default=None, help="With --over-ssh: the node's machine [default: NODE, as `llmgw node add` "
              "names it].")
@ssh_options
@click.option("--drain-timeout", type=float, default=DRAIN_TIMEOUT, show_default=True,
              help="Seconds to wait for its replicas to be placed elsewhere and stopped there.")
@click.option("--force", is_flag=True, help="Go on while it still serves after --drain-timeout.")
@click.option("--keep-machine", is_flag=True, help="Leave the machine as it is (gone, or unreachable): only drain "
              "and forget the node.")
@click.option("--keep-weights", is_flag=True, help="Keep the machine's weights directories (`llmgw wipe "
              "--keep-weights`).")
@click.option("--author-name", default=None, help="The drain commit's author [default: git config user.name].")
@click.option("--author-email", default=None, help="Its email [default: git config user.email].")
@admin_options
def remove_cmd(node, over_ssh, host, user, port, ssh_key, ssh_config, drain_timeout, force, keep_machine, keep_weights,
               author_name, author_email, url, token, state_dir):
    """Drain NODE, wipe llmgw off its machine over its agent's stream and forget it on the control plane."""
    from llmgw.cli.server_cmds import _git_identity
    from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin

    url, token = resolve_admin(url, token, state_dir)
    with AdminClient(url, token, ca_file=admin_ca_file(state_dir)) as client:
        nodes = client.get("/api/v1/status").get("nodes", {})
        if node not in nodes:
            raise UsageError(f"the control plane knows no node {node!r} (`llmgw nodes` lists them): nothing was "
                             "removed")
        if not (keep_machine or over_ssh) and nodes[node].get("state") != "connected":
            raise UsageError(f"node {node} is {nodes[node].get('state') or 'not connected'}, so its agent cannot wipe "
                             "its machine over its stream: start its agent there and run this again, or add "
                             "--over-ssh to wipe it over ssh (with the ssh options of `llmgw node add`), or "
                             "--keep-machine to leave the machine as it is. Nothing was removed")
        name, email = _git_identity(author_name, author_email)
        drained = client.post(f"/api/v1/nodes/{node}/drain", {"author_name": name, "author_email": email})
        click.echo(f"[{node}] drained (settings at {(drained.get('commit') or '?')[:12]}); waiting until it serves "
                   "no shard")
        empty, status = _poll(client, node, lambda s: not serving_shards(s, node), drain_timeout)
        if not empty:
            still = ", ".join(serving_shards(status, node))
            if not force:
                raise UsageError(f"node {node} still serves {still} after {drain_timeout:g} s of draining (`llmgw "
                                 "status` says where its replicas wait to be placed). It stays drained and nothing "
                                 f"was removed: run `llmgw node remove {node}` again once they moved, or add --force "
                                 "to remove it while it serves (its requests in flight fail)")
            click.echo(f"[{node}] still serves {still}: going on (--force)")
        if keep_machine:
            click.echo(f"[{node}] the machine is left as it is (--keep-machine)")
        elif over_ssh:
            _wipe_over_ssh(node, ssh_argv(host or node, user, port, ssh_key, ssh_config), keep_weights)
        else:
            _wipe_over_stream(client, node, keep_weights)
        gone, _ = _poll(client, node, lambda s: s.get("nodes", {}).get(node, {}).get("state") != "connected",
                        DISCONNECT_TIMEOUT if not keep_machine else 0)
        if not gone:
            raise InstallError(f"node {node} is still connected {DISCONNECT_TIMEOUT:g} s after its agent was stopped: "
                               "another agent runs under its id somewhere; stop it, then run `llmgw node remove "
                               f"{node} --keep-machine`")
        forgot = client.post(f"/api/v1/nodes/{node}/forget", {})
    revoked = forgot["certificates_revoked"]
    click.echo(f"node {node} removed: {revoked} certificate{'s' if revoked != 1 else ''} revoked, node secret "
               f"{'forgotten' if forgot['identity_forgotten'] else 'not recorded'}; it joins again only with a new "
               f"join token (`llmgw node add`). The settings keep it drained (`llmgw node uncordon {node}` lifts it).")


def register(group: click.Group) -> None:
    """Add `node remove` to the `node` group."""
    from llmgw.cli.node_cmds import node_group

    node_group(group).add_command(remove_cmd)

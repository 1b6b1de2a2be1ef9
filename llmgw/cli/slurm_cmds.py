"""`llmgw node cordon|uncordon|drain NODE`, `llmgw slurm lend|reclaim NODE` and `llmgw slurm render`.

The node verbs are commits to the settings on the operator's behalf, made by the control plane like `llmgw stop`
(POST /api/v1/nodes/NODE/VERB): cordon (no new replicas), drain (replicas placed elsewhere first, then stopped),
uncordon (both lifted), lend (`nodes.NODE.lent: true` in slurm.yaml: drained of replicas, kept off them),
reclaim (lent: false). `llmgw slurm users list` lists the members as Linux users (login, UID, home, keys) and
`llmgw slurm users keys add|list|remove` keeps their SSH keys (commits of slurm.yaml `ssh_keys`, GET/POST
/api/v1/slurm/users[/keys]). `llmgw slurm status` shows what the agents report of Slurm. `llmgw slurm render` prints the slurm.conf and gres.conf llmgw writes for a settings tree
and a fleet snapshot (`llmgw fleet snapshot`), or a node's `slurmd -C`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from llmgw.cli.node_cmds import node_group
from llmgw.cli.server_cmds import _client_options, _git_identity, _print_json, _short, counted

_SAYS = {
    "cordon": "cordoned: no new replica goes there; its replicas keep running",
    "uncordon": "uncordoned: replicas may be placed there again",
    "drain": "drained: its replicas are placed elsewhere first, then stopped there",
    "lend": "lent to Slurm: its replicas are placed elsewhere first, then stopped; none is placed there while lent",
    "reclaim": "reclaimed from Slurm: replicas may be placed there again",
}


def _verb(verb: str):
    @click.argument("node")
    @click.option("--author-name", default=None, help="Commit author [default: git config user.name].")
    @click.option("--author-email", default=None, help="Commit author email [default: git config user.email].")
    @_client_options
    def command(client, as_json, node, author_name, author_email):
        name, email = _git_identity(author_name, author_email)
        answer = client.post(f"/api/v1/nodes/{node}/{verb}", {"author_name": name, "author_email": email})
        if as_json:
            _print_json(answer)
            return
        if not answer.get("known", True):
            click.echo(f"warning: the control plane knows no node {node!r} (`llmgw nodes` lists them); the settings "
                       "say it all the same, for when such a node joins.", err=True)
        if not answer.get("changed", True):
            click.echo(f"{node} was already {_SAYS[verb].split(':')[0]}: nothing to commit "
                       f"(settings at {_short(answer['commit'])})")
        else:
            click.echo(f"{node} {_SAYS[verb]} (settings commit {_short(answer['commit'])} by {answer.get('author') or f'{name} <{email}>'})")

    return command


def slurm_status(status: dict[str, Any]) -> dict[str, Any]:
    """`llmgw slurm status --json` from the control plane's status document (GET /api/v1/status): {"controller":
    {"node", "slurmctld", "slurmdbd"} or None, "nodes": {node: {"state", "reason", "lent", "reclaiming",
    "job_steps", "slurmd", "version", "users", "warnings"}}, "job_steps": the total}. `users`: the Linux users llmgw
    made that the node has (slurm.yaml users: llmgw). A node is "reclaiming" while it is not
    lent and still runs job steps; a daemon's state is "" when the node does not run it. A node is listed when it runs
    slurmd, Slurm knows its state, or its report carries a warning (Slurm missing or broken there)."""
    controller = None
    nodes: dict[str, Any] = {}
    for name, node in sorted(status.get("nodes", {}).items()):
        slurm = node.get("slurm")
        if not slurm:
            continue
        daemons = slurm.get("daemons", {})
        if "slurmctld" in daemons:
            controller = {"node": name, "slurmctld": daemons["slurmctld"]["state"],
                          "slurmdbd": daemons.get("slurmdbd", {}).get("state", "")}
        if "slurmd" not in daemons and not slurm.get("node_state") and not slurm.get("warnings"):
            continue  # the controller alone, all well: its line says it
        steps = int(slurm.get("job_steps", 0))
        nodes[name] = {"state": slurm.get("node_state", ""), "reason": slurm.get("node_reason", ""),
                       "lent": bool(slurm.get("lent")), "reclaiming": not slurm.get("lent") and steps > 0,
                       "job_steps": steps, "slurmd": daemons.get("slurmd", {}).get("state", ""),
                       "version": slurm.get("version", ""), "users": int(slurm.get("users", 0)),
                       "warnings": list(slurm.get("warnings", ()))}
    return {"controller": controller, "nodes": nodes, "job_steps": sum(n["job_steps"] for n in nodes.values())}


def _status_lines(view: dict[str, Any]) -> list[str]:
    controller = view["controller"]
    if controller is None:
        lines = ["controller: none reports slurmctld (slurm.yaml enabled: false, or its agent is not connected)"]
    else:
        dbd = f", slurmdbd {controller['slurmdbd']}" if controller["slurmdbd"] else ""
        lines = [f"controller: {controller['node']} (slurmctld {controller['slurmctld']}{dbd})"]
    for name, node in view["nodes"].items():
        role = "reclaiming" if node["reclaiming"] else ("lent" if node["lent"] else "not lent")
        reason = f" ({node['reason']})" if node["reason"] else ""
        users = f", {counted(node['users'], 'user')}" if node["users"] else ""
        lines.append(f"{name}: {role}, Slurm state {node['state'] or 'unknown'}{reason}, {node['job_steps']} job "
                     f"step(s), slurmd {node['slurmd'] or 'not running'}{users}")
        lines += [f"  warning: {warning}" for warning in node["warnings"]]
    lines.append(f"job steps running: {view['job_steps']}")
    return lines


def read_keys(text: str) -> tuple[str, ...]:
    """The key lines of a public key file (`~/.ssh/id_ed25519.pub`, or several in authorized_keys form): blank
    lines and comments ('#') left out."""
    return tuple(line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def _users_lines(users: list[dict[str, Any]]) -> list[str]:
    if not users:
        return ["no users: slurm.yaml says users: none, or no project has members"]
    lines = []
    for user in users:
        where = user["home"] if user["member"] else "left: closed on the nodes, UID kept"
        lines.append(f"{user['login']:<20} {user['uid']:>7}  {user['email']}  {where}  {counted(len(user['keys']), 'key')}")
    return lines


def _register_users(slurm_group: click.Group) -> None:
    @slurm_group.group("users")
    def users_group() -> None:
        """Project members as Linux users on the Slurm nodes (users: llmgw): login, UID, home, SSH keys."""

    @users_group.command("list")
    @_client_options
    def users_list(client, as_json) -> None:
        """Every member given a login and UID (by UID; one who left keeps the UID), home and number of keys."""
        answer = client.get("/api/v1/slurm/users")
        if as_json:
            _print_json(answer)
        else:
            click.echo("\n".join(_users_lines(answer["users"])))

    @users_group.group("keys")
    def keys_group() -> None:
        """Members' SSH public keys (slurm.yaml ssh_keys), written where sshd reads them on every Slurm node."""

    def post(client, as_json, action, email, keys, author_name, author_email) -> None:
        name, address = _git_identity(author_name, author_email)
        answer = client.post("/api/v1/slurm/users/keys", {"action": action, "email": email, "keys": list(keys),
                                                          "author_name": name, "author_email": address})
        if as_json:
            _print_json(answer)
        elif not answer["changed"]:
            click.echo(f"nothing to {action}: slurm.yaml already says so (settings at {_short(answer['commit'])})")
        else:
            click.echo(f"{'added' if action == 'add' else 'removed'} {len(keys) or 'all'} key(s) of {email} "
                       f"(settings commit {_short(answer['commit'])} by {answer.get('author') or f'{name} <{address}>'})")

    author = [click.option("--author-name", default=None, help="Commit author [default: git config user.name]."),
              click.option("--author-email", default=None, help="Commit author email [default: git config user.email].")]

    @keys_group.command("add")
    @click.argument("email")
    @click.argument("key_file", type=click.File("r"), default="-")
    @author[0]
    @author[1]
    @_client_options
    def add_command(client, as_json, email, key_file, author_name, author_email) -> None:
        """Add the public keys in KEY_FILE (default: stdin) for member EMAIL: a commit to slurm.yaml as you."""
        from llmgw.errors import UsageError

        keys = read_keys(key_file.read())
        if not keys:
            raise UsageError(f"{key_file.name} holds no public key line (e.g. ~/.ssh/id_ed25519.pub)")
        post(client, as_json, "add", email, keys, author_name, author_email)

    @keys_group.command("remove")
    @click.argument("email")
    @click.argument("keys", nargs=-1)
    @author[0]
    @author[1]
    @_client_options
    def remove_command(client, as_json, email, keys, author_name, author_email) -> None:
        """Remove EMAIL's keys named by KEYS (a whole line, its base64 body or its comment); none named: all."""
        post(client, as_json, "remove", email, keys, author_name, author_email)

    @keys_group.command("list")
    @click.argument("email", required=False)
    @_client_options
    def list_command(client, as_json, email) -> None:
        """Each member's keys (of EMAIL only, when given)."""
        users = [u for u in client.get("/api/v1/slurm/users")["users"] if email in (None, u["email"])]
        if as_json:
            _print_json({"keys": {u["email"]: u["keys"] for u in users}})
            return
        for user in users:
            click.echo(f"{user['email']} ({user['login']}): {counted(len(user['keys']), 'key')}")
            for key in user["keys"]:
                click.echo(f"  {key}")


def register(group: click.Group) -> None:
    """Add `node cordon|uncordon|drain` (to the existing `node` group, or a new one) and the `slurm` group."""
    node = node_group(group)
    for verb, text in (("cordon", "No new replica on NODE (a settings commit as you); its replicas keep running."),
                       ("uncordon", "Lift cordon and drain from NODE (a settings commit as you)."),
                       ("drain", "Place NODE's replicas elsewhere first, then stop them there (a commit as you).")):
        node.command(verb, help=text)(_verb(verb))

    @group.group("slurm")
    def slurm_group() -> None:
        """Slurm beside llmgw: lend and reclaim nodes, render slurm.conf."""

    slurm_group.command("lend", help="Lend NODE to Slurm: nodes.NODE.lent: true in slurm.yaml, committed as you.")(
        _verb("lend"))
    slurm_group.command("reclaim", help="Take NODE back from Slurm: lent: false, committed as you.")(_verb("reclaim"))

    _register_users(slurm_group)

    @slurm_group.command("status")
    @_client_options
    def status_command(client, as_json) -> None:
        """Controller, slurmdbd, nodes lent or being reclaimed, job steps running (from the agents' reports)."""
        view = slurm_status(client.get("/api/v1/status"))
        if as_json:
            _print_json(view)
        else:
            click.echo("\n".join(_status_lines(view)))

    @slurm_group.command("render")
    @click.argument("settings_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
    @click.option("--fleet", "fleet_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                  help="A fleet snapshot (`llmgw fleet snapshot`).")
    @click.option("--slurmd-c", "slurmd_c", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                  help="A node's `slurmd -C` output instead of a fleet (one node: the controller).")
    @click.option("--address", default="127.0.0.1", show_default=True, help="With --slurmd-c: the node's address.")
    @click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
                  help="Write slurm.conf and gres.conf into this directory instead of printing them.")
    def render_command(settings_dir: Path, fleet_file: Path | None, slurmd_c: Path | None, address: str,
                       out: Path | None) -> None:
        """Print (or write) the slurm.conf and gres.conf llmgw makes of SETTINGS_DIR and a fleet."""
        from llmgw.errors import UsageError
        from llmgw.plan.slurm_conf import host_from_slurmd, hosts_of, render_slurm
        from llmgw.settings import load_directory
        from llmgw.tools.slurm import parse_slurmd_config

        settings = load_directory(settings_dir)
        if fleet_file is not None:
            import json

            from llmgw.plan.snapshot import snapshot_from_json

            hosts = hosts_of(snapshot_from_json(json.loads(fleet_file.read_text()), str(fleet_file)).fleet)
        elif slurmd_c is not None:
            node = settings.slurm.controller or "localhost"
            hosts = {node: host_from_slurmd(parse_slurmd_config(slurmd_c.read_text()), node, address)}
        else:
            raise UsageError("say where the fleet comes from: --fleet SNAPSHOT.json or --slurmd-c FILE")
        rendered = render_slurm(settings.slurm, hosts)
        for node in rendered.missing:
            click.echo(f"warning: {node} may be lent (slurm.yaml) but the fleet does not report it: left out", err=True)
        if out is None:
            click.echo("# slurm.conf\n" + rendered.slurm_conf + "\n# gres.conf\n" + rendered.gres_conf, nl=False)
            return
        out.mkdir(parents=True, exist_ok=True)
        (out / "slurm.conf").write_text(rendered.slurm_conf)
        (out / "gres.conf").write_text(rendered.gres_conf)
        click.echo(f"wrote {out / 'slurm.conf'} and {out / 'gres.conf'}")

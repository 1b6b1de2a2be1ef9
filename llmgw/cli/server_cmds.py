"""`llmgw server` and the commands that talk to a running control plane through its admin API.

    llmgw server --repo PATH|URL [--state DIR] ...      run the control plane (and its gateway)
    llmgw server init [--from DIR] [--store URL]        set this machine up for it (llmgw.cli.server_init)
    llmgw apply [--wait/--no-wait] [--allow-empty]       converge to the branch head now, with progress
                [--expect REV]                           ... only when the head is REV (what was reviewed)
    llmgw plan [REV]                                     the plan REV would run on the live fleet (`diff --live`)
    llmgw plan --at AUDIT_COMMIT                         a past pass's plan, made again (llmgw.cli.replay_cmds)
    llmgw status | history | nodes | replicas            where the cluster stands, what was done
    llmgw stop | start                                   serving.stopped commits, authored by you
    llmgw logs NODE [--shard S]                          an engine's (or the agent's) last log lines
    llmgw fabric-test A B                                ib_write_bw from A to B rail by rail, each graded
    llmgw join-token [--ttl S]                           a one-time token for `llmgw node join` (--tls)

`llmgw server` refuses a plain-text agents listener on an address other machines reach unless --insecure is
given (`llmgw.wire.check_agents_listener`), and a plain-text admin listener likewise (`--tls` or --admin-cert/--admin-key
serve it over HTTPS; `llmgw.control.admin_listener`).

Every client command takes --url / --token / --state (see llmgw.control.client for the lookup order) and
--json (the admin API's JSON, unchanged). Exit status: 0 done, 1 error; `plan` exits 2 when there are changes, `fabric-test` when a rail is not ok.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from functools import wraps
from pathlib import Path
from typing import Any

import click

from llmgw.control import stalls
from llmgw.errors import UsageError
from llmgw.units import format_duration, format_size


def _admin_options(func):
    """--url, --token, --state and --json, passed on as url, token, state_dir and as_json."""
    func = click.option("--json", "as_json", is_flag=True, help="Print the admin API's JSON.")(func)
    func = click.option("--state", "state_dir", envvar="LLMGW_STATE", default=None, type=click.Path(path_type=Path),
                        help="State directory of `llmgw server` / `llmgw up` [default: .state].")(func)
    func = click.option("--token", envvar="LLMGW_ADMIN_TOKEN", default=None,
                        help="Admin token [default: $LLMGW_ADMIN_TOKEN, then <state>/admin-token].")(func)
    return click.option("--url", envvar="LLMGW_ADMIN_URL", default=None,
                        help="Admin API URL [default: <state>/admin-url].")(func)


def _client_options(func):
    @_admin_options
    @wraps(func)
    def wrapper(url, token, state_dir, as_json, **kwargs):
        from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin

        click.get_current_context().meta["llmgw.admin_state"] = state_dir

        url, token = resolve_admin(url, token, state_dir)
        with AdminClient(url, token, ca_file=admin_ca_file(state_dir)) as client:
            return func(client, as_json, **kwargs)

    return wrapper


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def parse_listener(text: str | None):
    """"HOST:PORT" (":PORT" means 127.0.0.1) as a settings Listener; None when not given. Port 0: any free port.

    Raises UsageError naming the text when it is not HOST:PORT.
    """
    if not text:
        return None
    from llmgw.settings.model import Listener

    host, _, port = text.rpartition(":")
    if not port.isdigit():
        raise UsageError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:8081; port 0 picks a free one).")
    return Listener(host=host or "127.0.0.1", port=int(port))


def _git_identity(name: str | None, email: str | None) -> tuple[str, str]:
    def config(key: str) -> str | None:
        try:
            done = subprocess.run(["git", "config", "--get", key], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() or None

    name = name or config("user.name")
    email = email or config("user.email")
    if not name or not email:
        raise UsageError("who is doing this? pass --author-name and --author-email, or set git config "
                         "user.name and user.email: the commit is authored by you.")
    return name, email


# -- status rendering -----------------------------------------------------------------------------------------

def _short(commit: str | None) -> str:
    return commit[:12] if commit else "none"


def counted(number: int, noun: str) -> str:
    """"1 GPU", "2 GPUs", "0 shards": `number` and `noun`, with an s unless `number` is 1."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


_KEPT_OFF_TITLES = (("cordoned", "cordoned"), ("drained", "drained"), ("lent", "lent to Slurm"))


def render_status(doc: dict[str, Any]) -> list[str]:
    """The status document as lines for a person."""
    settings = doc.get("settings", {})
    lines = [f"settings    {_short(settings.get('commit'))} in force (branch head {_short(settings.get('head'))})"
             + ("  SERVING STOPPED" if settings.get("serving_stopped") else "")]
    for key, title in _KEPT_OFF_TITLES:
        if settings.get(key):
            lines.append(f"kept off    {title}: {', '.join(settings[key])}")
    for name, title in (("bad", "NOT APPLIED (does not validate)"), ("held", "HELD BACK")):
        rejected = settings.get(name)
        if rejected:
            lines.append(f"            {_short(rejected['commit'])} {title}:")
            lines += [f"              {issue['text']}" for issue in rejected["issues"]]
    if settings.get("remote_error"):
        lines.append(f"            {settings['remote_error']}")
    nodes = doc.get("nodes", {})
    lines.append(f"nodes       {len(nodes)}")
    for node_id, node in nodes.items():
        own = [s for s in node["shards"].values() if not s.get("foreign")]
        lines.append(f"  {node_id:<20} {node['state']:<12} {node['address']:<15} {node['cpu_cores']:g} cores, "
                     f"{counted(node['gpus'], 'GPU')}, {counted(len(own), 'shard')}")
        for engine, error in node.get("engine_errors", {}).items():
            lines.append(f"    install {engine} failed: {error}")
        lines += _health_lines(node.get("health"), "    ", only_blocking=True)
    replicas = doc.get("replicas", {})
    lines.append(f"replicas    {len(replicas)}")
    for replica_id, replica in replicas.items():
        where = replica.get("node", "")
        detail = ""
        if "unplaced" in replica:
            detail = "  " + "; ".join(f"{n}: {why}" for n, why in replica["unplaced"].items())
        errors = [s["error"] for s in replica.get("shards", {}).values() if s.get("error")]
        if errors:
            detail += "  " + errors[0]
        lines.append(f"  {replica_id:<24} {replica['state']:<10} {where}{detail}")
    for failure in doc.get("failures", []):
        lines.append(f"failed      {failure['kind']} {failure['subject']} on {failure['node']} "
                     f"({failure['attempts']}x): {failure['error']}")
    for note in doc.get("notes", []):
        lines.append(f"note        {note}")
    for canary in doc.get("canaries", {}).values():
        lines.append(f"canary      {canary['summary']}")
    ca = doc.get("control_plane", {}).get("ca")
    if ca:
        lines.append(f"agents' CA  valid until {ca['until']} ({ca['days_left']} days)")
        if ca.get("warning"):
            lines.append(f"WARNING     {ca['warning']}")
    rotation = doc.get("control_plane", {}).get("ca_rotation")
    if rotation:
        waiting = rotation["waiting"]
        lines.append(f"CA rotation new CA valid until {rotation['new_ca_until']}: {rotation['moved']} of "
                     f"{rotation['nodes']} nodes hold a certificate of it"
                     + (f"; waiting for {', '.join(waiting[:10])}{' ...' if len(waiting) > 10 else ''} (the old CA "
                        "is retired once none waits; `llmgw ca rotate --finish` retires it now)" if waiting else ""))
    for name, entry in doc.get("scaling", {}).items():
        lines.append(f"autoscaler  {name}: {entry['wanted']} wanted, {entry['ready']} ready, {entry['held']} held "
                     f"(range {entry['min']}-{entry['max']}): {entry['reason']}")
    upgrade = doc.get("upgrade")
    if upgrade:
        counts = ", ".join(f"{n} {phase}" for phase, n in upgrade["counts"].items())
        lines.append(f"upgrade     to llmgw {upgrade['version']}: {upgrade['state']} ({counts})"
                     + (f": {upgrade['reason']}" if upgrade.get("reason") else ""))
        lines += [f"  {n['node']:<20} {n['phase']:<11} {n['message']}" for n in upgrade["nodes"]
                  if n["phase"] not in ("done", "waiting")]
    last = doc.get("pass")
    if last:
        lines.append(f"last pass   #{last['number']} for {_short(last['settings_commit'])}: "
                     f"{'converged' if last['converged'] else 'converging'} (trigger: {last['trigger']})")
        for refused in last.get("refused", []):
            lines.append(f"not sent    {refused['kind']} {refused['subject']} on {refused['node']}: {refused['error']}")
    plane = doc.get("control_plane", {})
    if "leader" in plane:
        holder = plane.get("leader_holder") or "nobody (the lease is free)"
        lines.append(f"leader      this control plane ({holder}, token {plane.get('leader_token')})" if plane["leader"]
                     else f"leader      {holder}; this control plane stands by")
    if plane.get("fleet") and plane["fleet"] != "ready":
        lines.append(f"fleet       {plane['fleet']}")
    if plane.get("audit_error"):
        lines.append(f"audit       {plane['audit_error']}")
    return lines


def _reviewed_body(path: Path, expect: str | None) -> dict[str, Any]:
    """The apply body's "reviewed" from the review JSON at `path`. Raises UsageError for a file that is not one,
    a review of a directory (no head commit), or an --expect that is not its head commit."""
    try:
        doc = json.loads(path.read_text())
        reviewed = {"commit": doc["head"]["commit"], "fleet": doc["fleet"]["revision"], "plan": doc["plan"]}
        if isinstance(doc.get("forecast"), dict) and doc["forecast"].get("models"):
            reviewed["forecast"] = doc["forecast"]["models"]  # audited once the change ran (docs/review.md)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path} is not a review's JSON (`llmgw review BASE HEAD --json-file FILE`): {exc!r}") from exc
    if not isinstance(reviewed["commit"], str):
        raise UsageError(f"{path} reviews a directory, not a commit: there is no reviewed commit to apply")
    if expect and not reviewed["commit"].startswith(expect) and expect != reviewed["commit"]:
        raise UsageError(f"--expect {expect} is not the head {reviewed['commit'][:12]} that {path} reviewed")
    return reviewed


def _render_event(event: dict[str, Any]) -> list[str]:
    kind = event.get("event")
    if kind == "reviewed":
        if not event.get("lines"):
            return [f"as reviewed: every replica is placed where the review of {_short(event.get('commit'))} showed"]
        return ["differs from the reviewed plan:", *(f"  {line}" for line in event["lines"])]
    if kind == "waiting":
        return [event["message"]]
    if kind == "settings":
        if event.get("ok"):
            return [f"settings {_short(event.get('commit'))}"]
        return [event.get("message", "settings not applied")]
    if kind == "pass":
        out = [f"pass #{event['pass']}: " + ("converged" if event["converged"] else "converging")]
        out += [f"  {line}" for line in event.get("sent", [])]
        out += [f"  failed: {line}" for line in event.get("failed", [])]
        out += [f"  {line}" for line in event.get("unplaced", [])]
        states = ", ".join(f"{rid} {state}" for rid, state in event.get("replicas", {}).items())
        if states:
            out.append(f"  replicas: {states}")
        return out
    if kind == "done":
        if event.get("converged"):
            return [f"converged to {_short(event.get('commit'))}"]
        return [event.get("message") or f"not converged yet to {_short(event.get('commit'))}; see `llmgw status`"]
    return []


# -- live plan (`llmgw diff --live`) ---------------------------------------------------------------------------

def live_diff(client, rev: str | None, as_json: bool) -> int:
    """Print the plan `rev` (None: the branch head) would run on the live fleet; return the exit status
    (0 no changes, 2 changes). Used by `llmgw plan` and meant for `llmgw diff --live`."""
    answer = client.get("/api/v1/plan", rev=rev)
    if as_json:
        _print_json(answer)
    else:
        lines = list(answer["lines"]) + list(answer.get("forecast_lines") or [])
        if not answer["changes"]:
            lines.insert(0, "no changes: the fleet already runs these settings")
        lines += [expected_speed_line(speed) for speed in answer.get("expected_speeds", ())]
        for line in lines:
            click.echo(line)
    return 2 if answer["changes"] else 0


def expected_speed_line(speed: dict[str, Any]) -> str:
    """One line for a CPU replica's expected decode speed (`ExpectedSpeed.to_json`): "expected gemma-0 on n1:
    about 62 tokens/s decode (241.4Mi of weights, 2 threads reading 31.7 GB/s)". Pure."""
    return (f"expected {speed['replica_id']} on {speed['node_id']}: about {speed['decode_tokens_per_second']:.0f} "
            f"tokens/s decode ({format_size(speed['weight_bytes'])} of weights, {speed['threads']} "
            f"thread{'' if speed['threads'] == 1 else 's'} reading {speed['bandwidth_bytes_per_second'] / 1e9:.1f} "
            f"GB/s)")


# -- commands ---------------------------------------------------------------------------------------------------

@click.group("server", invoke_without_command=True)
@click.option("--repo", default=None, help="Settings repository: a local path or a URL (https, ssh, file) [required].")
@click.option("--repo-ssh-key", "repo_ssh_key", envvar="LLMGW_REPO_SSH_KEY", default=None,
              type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Private key (a deploy key without passphrase) for an ssh --repo URL; the host key must be in "
                   "~/.ssh/known_hosts.")
@click.option("--branch", default="main", show_default=True, help="Branch holding the settings.")
@click.option("--state", "state_dir", envvar="LLMGW_STATE", default=".state", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="State directory (store, mirror, tokens).")
@click.option("--store", envvar="LLMGW_STORE", default=None, help="Store path, sqlite:///path or postgresql://... ($LLMGW_STORE) [default: llmgw.yaml store:, else <state>/llmgw.sqlite3].")
@click.option("--secrets", "secrets_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Directory of named secrets (hf-token, webhook, ...) [default: <state>/secrets].")
@click.option("--gateway", "gateway_addr", metavar="HOST:PORT", help="Gateway listener (overrides llmgw.yaml).")
@click.option("--admin", "admin_addr", metavar="HOST:PORT", help="Admin API listener (overrides llmgw.yaml).")
@click.option("--agents", "agents_addr", metavar="HOST:PORT", help="Agents' gRPC listener (overrides llmgw.yaml).")
@click.option("--no-gateway", is_flag=True, help="Run no gateway in this process.")
@click.option("--gateway-workers", "gateway_workers", default=None, metavar="N|auto",
              help="Processes serving the gateway port together (overrides llmgw.yaml listeners.gateway.workers; "
                   "1: in this process; auto: one per CPU core).")
@click.option("--tls", is_flag=True, help="Agents connect with mutual TLS (CA in <state>/ca); nodes join with "
              "one-time tokens from `llmgw join-token`; the admin API and console serve HTTPS with a certificate of "
              "that CA (unless --admin-cert is given).")
@click.option("--tls-hostname", "tls_hostnames", multiple=True, metavar="NAME",
              help="With --tls: a name or address the agents dial (repeatable; default: the agents' listener host, "
                   "or on 0.0.0.0 this machine's name and non-loopback addresses), "
                   "put in the agents' and admin listeners' certificates beside localhost and 127.0.0.1.")
@click.option("--admin-cert", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Serve the admin API and console over HTTPS with this certificate (PEM chain); needs --admin-key.")
@click.option("--admin-key", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="The private key (PEM) of --admin-cert.")
@click.option("--trusted-proxy", "trusted_proxy", multiple=True, metavar="ADDRESS",
              help="A TLS-terminating proxy in front of the admin listener (an IP address or network; repeatable): "
              "its X-Forwarded-Proto and X-Forwarded-For are believed, nobody else's.")
@click.option("--join-port", default=0, show_default=True, help="Port answering Join with --tls (0: a free one).")
@click.option("--insecure", is_flag=True, help="Allow agents, the admin API and the console in plain text on an "
              "address other machines reach (refused without TLS otherwise): only on a network where every machine "
              "is trusted.")
@click.option("--otlp-endpoint", envvar="LLMGW_OTLP_ENDPOINT", default=None, metavar="URL",
              help="Send traces of reconcile passes, replica starts and engine installs to this OTLP/HTTP collector "
              "(http://host:4318) [default: llmgw.yaml tracing.endpoint; off without one].")
@click.option("--trace-requests", "request_sample_ratio", envvar="LLMGW_TRACE_REQUESTS", default=None,
              type=click.FloatRange(0.0, 1.0), metavar="RATIO",
              help="Trace this share (0-1) of the gateway's requests (0: none) [default: llmgw.yaml "
              "tracing.sample_requests, else 0].")
@click.option("--lease", "lease", default="6s", show_default=True, metavar="DURATION",
              help="How long the leader lease lasts in the store (renewed every third of it): a standby takes over "
                   "this long after the leader dies.")
@click.option("--recovery-grace", "recovery_grace", default="20s", show_default=True, metavar="DURATION",
              help="After a start, how long at most the gateway's /health says 503 \"recovering\" while nodes "
                   "connected before have not reconnected.")
@click.pass_context
def server_cmd(ctx, repo, repo_ssh_key, branch, state_dir, store, secrets_dir, gateway_addr, admin_addr, agents_addr,
               no_gateway, gateway_workers, tls, tls_hostnames, admin_cert, admin_key, trusted_proxy, join_port,
               insecure, otlp_endpoint, request_sample_ratio, lease, recovery_grace):
    """Run the control plane: settings watcher, reconciler, agents' service, admin API and gateway.
    `llmgw server init` sets a machine up for it first (state, CA, admin token, settings, systemd unit).

    Without --tls the agents' listener must be a loopback address (127.0.0.1, ::1, localhost) unless --insecure
    is given: a plain-text listener lets any machine that reaches it register as a node. Likewise the admin
    listener without --tls or --admin-cert/--admin-key: admin tokens and console cookies would cross in plain text.

    SIGTERM and SIGINT (Ctrl-C) stop it alike: queued audit commits written, the leader lease released, exit 0.
    """
    if ctx.invoked_subcommand:  # `llmgw server init`: the group's own options are not for it
        return
    if not repo:
        raise click.UsageError("Missing option '--repo' (the settings repository; `llmgw server init` makes one).")
    import trio

    from llmgw.cli.console_mount import console_mount
    from llmgw.control import ControlConfig, ControlPlane

    from llmgw.units import parse_duration

    try:
        lease_seconds = parse_duration(lease)
    except ValueError as exc:
        raise UsageError(f"--lease: {exc}") from None
    try:
        grace_seconds = parse_duration(recovery_grace)
    except ValueError as exc:
        raise UsageError(f"--recovery-grace: {exc}") from None
    if gateway_workers is not None and gateway_workers != "auto" and not (
            gateway_workers.isdigit() and 1 <= int(gateway_workers) <= 256):
        raise UsageError(f"--gateway-workers {gateway_workers!r}: give a number from 1 to 256, or auto.")
    if "://" not in repo and "@" not in repo.split(":", 1)[0]:
        repo = str(Path(repo).resolve())
    from llmgw.settings import redact_url

    if repo_ssh_key is not None and not (repo.startswith("ssh://") or "://" not in repo and "@" in repo):
        raise UsageError(f"--repo-ssh-key is for an ssh settings repository (ssh://user@host/path or "
                         f"user@host:path), not {redact_url(repo)}: drop it, or give the ssh URL.")
    if tls_hostnames and not tls:
        raise UsageError("--tls-hostname names the agents' certificate: give it with --tls.")
    if (admin_cert is None) != (admin_key is None):
        raise UsageError("--admin-cert and --admin-key go together: give the certificate and its private key.")
    from llmgw.control.admin_listener import AdminTls, trusted_proxies

    trusted_proxies(trusted_proxy)  # a wrong address is a sentence now, not at start
    admin_tls = AdminTls(admin_cert, admin_key) if admin_cert else (True if tls else None)
    plane = ControlPlane(ControlConfig(
        repo=repo, repo_ssh_key=repo_ssh_key, branch=branch, state_dir=Path(state_dir), store=store, secrets_dir=secrets_dir,
        gateway_listener=parse_listener(gateway_addr), admin_listener=parse_listener(admin_addr),
        agents_listener=parse_listener(agents_addr), gateway=not no_gateway, tls=tls,
        tls_hostnames=tuple(dict.fromkeys((*tls_hostnames, "localhost", "127.0.0.1"))) if tls_hostnames else (),
        join_port=join_port,
        insecure_agents=insecure, admin_tls=admin_tls, insecure_admin=insecure, trusted_proxies=tuple(trusted_proxy),
        otlp_endpoint=otlp_endpoint, lease_seconds=lease_seconds,
        recovery_grace=grace_seconds,
        request_sample_ratio=request_sample_ratio,
        gateway_workers=gateway_workers if gateway_workers in (None, "auto") else int(gateway_workers),
        admin_mounts=(console_mount,),
    ))

    stopped: list[str] = []  # the signal that stopped the server, when one did

    async def stop_on_signals(signals, scope: trio.CancelScope) -> None:
        async for signum in signals:
            stopped.append(signal.Signals(signum).name)
            scope.cancel()  # plane.run's exit writes the queued audit commits and releases the lease

    async def main() -> None:
        # SIGINT (Ctrl-C) is received like SIGTERM, not raised as KeyboardInterrupt wherever a task happens to be
        # (trio's default): the same orderly stop, with no traceback.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stop_on_signals, signals, nursery.cancel_scope)
                await serve(nursery)

    async def serve(nursery: trio.Nursery) -> None:
        await nursery.start(plane.run)
        click.echo(f"admin API    {plane.admin_url}   (token in {Path(state_dir) / 'admin-token'})", err=True)
        click.echo(f"console      {plane.admin_url}/console/   (log in with the admin token)", err=True)
        if plane.gateway_url:
            click.echo(f"gateway      {plane.gateway_url}/v1", err=True)
        click.echo(f"agents       port {plane.agents_port}"
                   + (f" (mutual TLS; join port {plane.join_port})" if plane.join_port else ""), err=True)
        settings = plane.snapshot().settings
        click.echo(f"settings     {_short(settings.commit if settings else None)} from {repo}", err=True)
        sys.stderr.flush()
        await plane.restart_requested.wait()
        await trio.sleep(0.5)  # let the answers already sent (`llmgw restart`'s own) leave the sockets
        nursery.cancel_scope.cancel()

    try:
        trio.run(main, instruments=stalls.from_environment())
    except KeyboardInterrupt:
        click.echo("stopped", err=True)
        return
    if stopped:
        click.echo(f"stopped ({stopped[0]}): queued audit commits written, leader lease released", err=True)
        return
    click.echo("restarting the control plane (`llmgw restart`)", err=True)
    sys.stderr.flush()
    # -P: no working directory on sys.path, so a `llmgw/` directory where the server runs cannot shadow llmgw; the
    # working directory itself is kept (relative paths on the command line keep their meaning).
    os.execv(sys.executable, [sys.executable, "-P", "-m", "llmgw.cli", *sys.argv[1:]])


@click.command("apply")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until the fleet converged.")
@click.option("--allow-empty", is_flag=True, help="Apply even a catalog that would stop every model.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds to wait for convergence.")
@click.option("--expect", metavar="REV", default=None,
              help="Apply only if the settings branch head is REV (the commit that was reviewed: the review comment "
                   "names it); otherwise refuse, saying what changed since.")
@click.option("--review", "review_file", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A review's JSON (`llmgw review --json-file`): apply only its head commit (as --expect) and record "
                   "in the audit where each pass's placements differ from the plan it showed, and why; the review's "
                   "forecast is checked and its error audited `reconcile.forecast_check_after` after the change "
                   "converged.")
@_client_options
def apply_cmd(client, as_json, wait, allow_empty, timeout, expect, review_file):
    """Converge the fleet to the settings branch head now, showing progress. With --expect REV, only when the head
    is REV (exit 1 and the commits since, otherwise)."""
    ok = False
    body: dict[str, Any] = {"wait": wait, "allow_empty": allow_empty, "timeout": timeout, "who": "llmgw apply"}
    if expect:
        body["expect"] = expect
    if review_file is not None:
        body["reviewed"] = _reviewed_body(review_file, expect)
    for event in client.stream("/api/v1/apply", body):
        if event.get("event") == "end":
            ok = bool(event.get("ok"))
            continue
        if as_json:
            click.echo(json.dumps(event))
        else:
            for line in _render_event(event):
                click.echo(line)
    sys.exit(0 if ok else 1)


@click.command("restart")
@click.option("--agents-only", is_flag=True, help="Restart the agents only, not the control plane.")
@_client_options
def restart_cmd(client, as_json, agents_only):
    """Restart every agent over its stream (engines keep serving and are adopted, same pids), then the control
    plane (`llmgw server` re-executes itself). Exit 1 when an agent could not restart."""
    ok = False
    for event in client.stream("/api/v1/restart", {"control_plane": not agents_only}):
        if event.get("event") == "end":
            ok = bool(event.get("ok"))
            continue
        if as_json:
            click.echo(json.dumps(event))
        else:
            click.echo(("ok      " if event.get("ok") else "FAILED  ") + event.get("message", ""))
    sys.exit(0 if ok else 1)


@click.command("plan")
@click.argument("rev", required=False)
@click.option("--at", "at", metavar="AUDIT_COMMIT", default=None,
              help="Make the plan of a past pass again, from the fleet its audit commit recorded (no control plane "
                   "needed; read from --repo); exit 1 when it is not the plan that pass made.")
@click.option("--repo", default=None, help="With --at: the settings repository holding refs/llmgw/audit [default: "
              "<state>/settings.git when it exists, else the one around the current directory].")
@_admin_options
def plan_cmd(rev, at, repo, url, token, state_dir, as_json):
    """Show what REV (default: the branch head) would start, stop or move on the live fleet, and what cannot be
    placed and why; with --at AUDIT_COMMIT, the plan that audit commit's pass made, made again. Exit 0: no
    changes, 2: changes, 1: error. (`llmgw diff --live`, `llmgw diff --at`.)"""
    if at is not None:
        if rev is not None:
            raise click.UsageError("--at takes the audit commit; give no REV with it (the pass's settings are used)")
        from llmgw.cli.replay_cmds import plan_at_command

        sys.exit(plan_at_command(at, repo, state_dir, as_json))
    from llmgw.control.client import AdminClient, admin_ca_file, resolve_admin

    url, token = resolve_admin(url, token, state_dir)
    with AdminClient(url, token, ca_file=admin_ca_file(state_dir)) as client:
        sys.exit(live_diff(client, rev, as_json))


@click.command("status")
@_client_options
def status_cmd(client, as_json):
    """Where the cluster stands: settings in force (and any commit not applied, with why), nodes, replicas,
    canaries."""
    doc = client.get("/api/v1/status")
    if as_json:
        _print_json(doc)
        return
    for line in render_status(doc):
        click.echo(line)


@click.command("history")
@click.option("--limit", default=20, show_default=True, help="How many audit commits.")
@click.option("--author", default=None, metavar="PERSON",
              help="Only the passes that worked for PERSON's settings commits (a name or e-mail, or part of one).")
@_client_options
def history_cmd(client, as_json, limit, author):
    """What was done: the audit commits (refs/llmgw/audit), newest first, each with who authored the settings."""
    answer = client.get("/api/v1/history", limit=limit, author=author)
    if as_json:
        _print_json(answer)
        return
    import time

    for entry in answer["entries"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(entry.get("time", 0)))
        subject = (entry.get("message") or "").splitlines()[0] if entry.get("message") else ""
        by = f"  by {entry['settings_author']}" if entry.get("settings_author") else ""
        click.echo(f"{entry.get('commit', '')[:12]}  {when}  {subject}{by}")
    if author and not answer["entries"]:
        click.echo(f"No audit commit (of the last 10,000) worked for settings authored by {author!r}.", err=True)


def _stop_start(stopped: bool):
    @click.option("--author-name", default=None, help="Commit author [default: git config user.name].")
    @click.option("--author-email", default=None, help="Commit author email [default: git config user.email].")
    @_client_options
    def command(client, as_json, author_name, author_email):
        name, email = _git_identity(author_name, author_email)
        answer = client.post(f"/api/v1/{'stop' if stopped else 'start'}",
                             {"author_name": name, "author_email": email})
        if as_json:
            _print_json(answer)
        else:
            verb = "stopped: every replica stops; the gateway answers 503" if stopped else "started: replicas start again"
            click.echo(f"serving {verb} (settings commit {_short(answer['commit'])} by {answer.get('author') or f'{name} <{email}>'})")

    return command


stop_cmd = click.command("stop", help="Stop serving: commit serving.stopped: true as you; every replica stops.")(
    _stop_start(True))
start_cmd = click.command("start", help="Serve again: commit serving.stopped: false as you.")(_stop_start(False))


@click.command("join-token")
@click.option("--ttl", default=3600.0, show_default=True, help="Seconds the token stays valid.")
@click.option("--ca-out", type=click.Path(dir_okay=False, path_type=Path), default=Path("ca.crt"), show_default=True,
              help="Where to write the CA certificate the node needs.")
@_client_options
def join_token_cmd(client, as_json, ttl, ca_out):
    """A one-time token for a new node to join (control planes run with --tls)."""
    answer = client.post("/api/v1/join-tokens", {"ttl_seconds": ttl})
    ca_out.write_text(answer["ca_pem"])
    if as_json:
        _print_json({**answer, "ca_file": str(ca_out)})
        return
    host = client.url.split("://", 1)[-1].rsplit(":", 1)[0]
    click.echo(f"token {answer['token']} (valid {ttl:g} s, once); CA certificate written to {ca_out}")
    click.echo(f"on the node: llmgw node join --control-plane {host}:{answer['join_port']} "
               f"--token {answer['token']} --ca-file {ca_out}")


def _health_lines(health: dict | None, indent: str, *, only_blocking: bool = False) -> list[str]:
    """A node's health findings (its status document's "health"), one line each: "GPU 1 fail: <message>"; with
    `only_blocking`, only those that take a card out of placement."""
    if not health:
        return []
    lines = []
    for card in health.get("cards", []):
        for finding in card.get("findings", []):
            if only_blocking and not finding.get("blocks_placement"):
                continue
            out = " (out of placement)" if finding.get("blocks_placement") else ""
            lines.append(f"{indent}GPU {card['index']} {finding['level']}{out}: {finding['message']}")
    for finding in health.get("unattributed", []):
        if not only_blocking or finding.get("blocks_placement"):
            lines.append(f"{indent}{finding['level']}: {finding['message']}")
    return lines


@click.command("nodes")
@_client_options
def nodes_cmd(client, as_json):
    """The nodes the control plane knows, with their state and shards, each replica's measured speed (what routing
    uses, with its source and age) and its latest `llmgw bench` (from the store, when it is found on this machine)."""
    from llmgw.cli.bench_cmds import bench_line, latest_benches

    answer = client.get("/api/v1/nodes")
    if as_json:
        _print_json(answer)
        return
    benches = latest_benches(click.get_current_context().meta.get("llmgw.admin_state"))
    speeds = dict(answer.get("speeds", {}))
    kept_off = {node_id: [title for key, title in _KEPT_OFF_TITLES if node_id in answer.get(key, ())]
                for node_id in answer["nodes"]}
    for node_id, node in answer["nodes"].items():
        marks = "".join(f"  ({title})" for title in kept_off[node_id])
        click.echo(f"{node_id:<20} {node['state']:<12} {node['address']:<15} {node['cpu_cores']:g} cores  "
                   f"{counted(node['gpus'], 'GPU')}  engines: {', '.join(node['engines']) or 'none'}{marks}")
        if node.get("agent_version"):
            signed = (f"from a release signed by key {node['release_key']}" if node.get("release_key")
                      else "not installed from a signed release")
            click.echo(f"  llmgw {node['agent_version']}, {signed}")
        if node.get("lacks"):
            click.echo(f"  its agent lacks {', '.join(node['lacks'])}: nothing that needs them is sent to it "
                       "(upgrade it)")
        for shard_id, shard in node["shards"].items():
            extra = f"  {shard['error']}" if shard.get("error") else ""
            foreign = " (not started by llmgw)" if shard.get("foreign") else ""
            click.echo(f"  {shard_id:<28} {shard['state']:<10} port {shard['port']}{foreign}{extra}")
            if shard.get("replica") in speeds:
                click.echo(f"    {speed_line(speeds.pop(shard['replica']))}")
            if shard.get("replica") in benches:
                click.echo(f"    {bench_line(benches.pop(shard['replica']))}")
        if node.get("memory_bandwidth"):
            click.echo(f"  {bandwidth_line(node['memory_bandwidth'])}")
        for line in _health_lines(node.get("health"), "  "):
            click.echo(line)
        firewall = node.get("firewall")
        if firewall:
            held = f"table inet llmgw {firewall['digest']}" if firewall.get("digest") else "no table"
            click.echo(f"  firewall: {held}" + (f"; {firewall['error']}" if firewall.get("error") else ""))


@click.command("replicas")
@_client_options
def replicas_cmd(client, as_json):
    """Every replica: its model, node and state, or why it cannot be placed, and its measured speed (source, age)."""
    answer = client.get("/api/v1/replicas")
    if as_json:
        _print_json(answer)
        return
    if answer.get("serving_stopped"):
        click.echo("serving is stopped (`llmgw stop`): every replica stops; `llmgw start` resumes")
    elif not answer["replicas"]:
        click.echo("no replicas: the catalog asks for none (catalog/*.yaml `replicas:`)")
    for replica_id, replica in answer["replicas"].items():
        detail = ""
        if "unplaced" in replica:
            detail = "  " + "; ".join(f"{n}: {why}" for n, why in replica["unplaced"].items())
        click.echo(f"{replica_id:<24} {replica['model']:<24} {replica['state']:<10} {replica.get('node', '')}{detail}")
        if replica.get("speed"):
            click.echo(f"  {speed_line(replica['speed'])}")


def bandwidth_line(probe: dict[str, Any]) -> str:
    """One line for a node's memory bandwidth (the agent's probe as JSON, `MemoryBandwidth.to_json`): "memory
    bandwidth: one core 11.2 GB/s, 2 cores 18.0 GB/s (read, 0.5 s)". Pure."""
    return (f"memory bandwidth: one core {probe['one_core_bytes_per_second'] / 1e9:.1f} GB/s, {probe['threads']} "
            f"cores {probe['all_cores_bytes_per_second'] / 1e9:.1f} GB/s (read, {probe['seconds']:.1f} s)")


def speed_line(speed: dict[str, Any]) -> str:
    """One line for a replica's measured speed (a status document's `replicas.<id>.speed`): "speed: prefill 45.2
    tokens/s, decode 13.9 tokens/s, 4 slots (metrics, 12s ago)". Pure."""
    slots = f", {speed['slots']} slots" if speed.get("slots") else ""
    return (f"speed: prefill {speed['prefill_tokens_per_second']:.1f} tokens/s, decode "
            f"{speed['decode_tokens_per_second']:.1f} tokens/s{slots} ({speed['source']}, "
            f"{format_duration(speed['age_seconds'])} ago)")


@click.command("logs")
@click.argument("node")
@click.option("--shard", default="", help="Shard id (e.g. gemma-3-270m-0/0) [default: the agent's own log].")
@click.option("--lines", default=200, show_default=True, help="How many of the last lines.")
@_client_options
def logs_cmd(client, as_json, node, shard, lines):
    """The last log lines of a shard's engine (or of the agent) on NODE."""
    answer = client.get("/api/v1/logs", node=node, shard=shard, lines=lines)
    if as_json:
        _print_json(answer)
        return
    for line in answer["lines"]:
        click.echo(line)


def render_rails(doc: dict[str, Any]) -> list[str]:
    """One line per rail of POST /api/v1/fabric-test's answer: "rail 0  mlx5_0 -> mlx5_0  392.1 of 400 Gb/s
    (98.0 %)  ok", the reason after the grade when there is one."""
    lines = []
    for rail in doc["rails"]:
        pair = f"{rail['a'] or '-'} -> {rail['b'] or '-'}"
        figure = "no result"
        if rail["measured_gbps"] is not None:
            figure = f"{rail['measured_gbps']:.1f}"
            figure += f" of {rail['rate_gbps']:g} Gb/s" if rail["rate_gbps"] else " Gb/s, link rate unknown"
            figure += f" ({rail['percent']:.1f} %)" if rail["percent"] is not None else ""
        reason = f": {rail['reason']}" if rail["reason"] else ""
        lines.append(f"rail {rail['index']}  {pair}  {figure}  {rail['grade']}{reason}")
    return lines


@click.command("fabric-test")
@click.argument("a")
@click.argument("b")
@_client_options
def fabric_test_cmd(client, as_json, a, b):
    """Measure the InfiniBand/RoCE rails from node A to node B with perftest's ib_write_bw, rail i with rail i.

    B's agent runs the server, A's the client, adapter by adapter, over the agents' own streams (no SSH). Each
    rail is graded against its link's rate: ok at 90 % or more, degraded below, failed without a result.
    Exits 2 when a rail is not ok. Both nodes need perftest (Debian/Ubuntu: apt install perftest).
    """
    answer = client.post("/api/v1/fabric-test", {"a": a, "b": b})
    if as_json:
        _print_json(answer)
    else:
        click.echo(f"{a} -> {b}: ib_write_bw, {counted(len(answer['rails']), 'rail')}")
        for line in render_rails(answer):
            click.echo(line)
    if any(rail["grade"] != "ok" for rail in answer["rails"]):
        sys.exit(2)


def register(group: click.Group) -> None:
    """Add the commands of this module (the module docstring lists them) to `group`; `server init` under `server`."""
    from llmgw.cli.server_init import init_cmd

    server_cmd.add_command(init_cmd)
    for command in (server_cmd, apply_cmd, plan_cmd, status_cmd, history_cmd, stop_cmd, start_cmd, nodes_cmd,
                    replicas_cmd, logs_cmd, join_token_cmd, restart_cmd, fabric_test_cmd):
        group.add_command(command)

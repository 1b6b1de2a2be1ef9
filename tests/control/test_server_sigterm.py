"""`llmgw server` stopped with SIGTERM (systemd's stop, `kill`) or SIGINT (Ctrl-C in its terminal) shuts down in
order: queued audit commits written, the leader lease released so a standby leads at once, exit status 0, and no
traceback (a real server process, with two gateway workers for Ctrl-C, which reaches the whole process group)."""

from __future__ import annotations

import os
import signal

import pytest

from llmgw.control.leading import LEASE_NAME
from llmgw.settings import init_repository
from llmgw.store import open_store
from support.llmgw_processes import LlmgwProcesses

from .conftest import write_seed
from .process_fleet import spawn_server
from .test_fleet_end_to_end import wait_for


def _sigterm_to_the_server(server) -> None:
    server.send_signal(signal.SIGTERM)


def _ctrl_c(server) -> None:
    os.killpg(server.pid, signal.SIGINT)  # a terminal's Ctrl-C: every process of the foreground group


@pytest.mark.parametrize("name, send, args", [
    ("SIGTERM", _sigterm_to_the_server, ()),
    ("SIGINT", _ctrl_c, ("--gateway-workers", "2")),
], ids=["sigterm", "ctrl-c"])
def test_a_stop_signal_releases_the_lease_and_exits_0_without_a_traceback(tmp_path, name, send, args):
    repo, state = tmp_path / "settings.git", tmp_path / "state"
    init_repository(repo, write_seed(tmp_path / "seed", "ab" * 32))
    procs = LlmgwProcesses(tmp_path)
    try:
        server, admin = spawn_server(procs, repo, state, *args)
        wait_for(lambda: admin.get("/api/v1/health").json()["leader"], 60, "the server to lead")
        store = open_store(state / "llmgw.sqlite3")
        try:
            assert store.lease_holder(LEASE_NAME) is not None
            send(server)
            assert server.wait(timeout=30) == 0
            assert store.lease_holder(LEASE_NAME) is None  # released, not left to expire
        finally:
            store.close()
        log = (tmp_path / "server.log").read_text()  # the server's and its workers' stdout and stderr
        assert f"stopped ({name}): queued audit commits written, leader lease released" in log
        assert "Traceback" not in log and "KeyboardInterrupt" not in log
    finally:
        procs.stop()


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as file:
            found += [int(child) for child in file.read().split()]
    return found


def test_ctrl_c_while_the_gateway_workers_start_exits_0_without_a_traceback(tmp_path):
    """Ctrl-C moments after start-up (the gateway workers still importing, or not yet ready) ends the server and its
    workers quietly: no traceback from a worker, no 'worker ... ended with status' line, exit status 0."""
    repo, state = tmp_path / "settings.git", tmp_path / "state"
    init_repository(repo, write_seed(tmp_path / "seed", "ab" * 32))
    procs = LlmgwProcesses(tmp_path)
    try:
        server = procs.spawn("server", "server", "--repo", str(repo), "--state", str(state), "--gateway",
                             "127.0.0.1:0", "--admin", "127.0.0.1:0", "--agents", "127.0.0.1:0",
                             "--gateway-workers", "2")
        wait_for(lambda: len(_children(server.pid)) >= 2, 60, "the gateway workers to start",
                 lambda: (tmp_path / "server.log").read_text())
        _ctrl_c(server)
        assert server.wait(timeout=30) == 0
        log = (tmp_path / "server.log").read_text()
        assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
        assert "ended with status" not in log, log
    finally:
        procs.stop()

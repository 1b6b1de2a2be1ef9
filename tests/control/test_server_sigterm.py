"""`llmgw server` stopped with SIGTERM (systemd's stop, `kill`) shuts down in order: queued audit commits written,
the leader lease released so a standby leads at once, exit status 0 (a real server process)."""

from __future__ import annotations

import signal

from llmgw.control.leading import LEASE_NAME
from llmgw.settings import init_repository
from llmgw.store import open_store
from support.llmgw_processes import LlmgwProcesses

from .conftest import write_seed
from .process_fleet import spawn_server
from .test_fleet_end_to_end import wait_for


def test_sigterm_releases_the_lease_and_exits_0(tmp_path):
    repo, state = tmp_path / "settings.git", tmp_path / "state"
    init_repository(repo, write_seed(tmp_path / "seed", "ab" * 32))
    procs = LlmgwProcesses(tmp_path)
    try:
        server, admin = spawn_server(procs, repo, state)
        wait_for(lambda: admin.get("/api/v1/health").json()["leader"], 60, "the server to lead")
        store = open_store(state / "llmgw.sqlite3")
        try:
            assert store.lease_holder(LEASE_NAME) is not None
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=30) == 0
            assert store.lease_holder(LEASE_NAME) is None  # released, not left to expire
        finally:
            store.close()
        assert "stopped (SIGTERM)" in (tmp_path / "server.log").read_text()
    finally:
        procs.stop()

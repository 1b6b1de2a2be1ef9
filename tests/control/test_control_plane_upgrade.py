"""Control planes go first (issue 30; docs/operations.md "Control planes go first"): two `llmgw server`s of the
previous release on one PostgreSQL schema, the leader and a standby, behind haproxy (docs/ha.md "One address for
clients"), with the previous release's agent serving "tiny" (the llama-server stand-in) and 16 openai SDK clients
asking throughout. The standby is stopped and started again on this tree's code (its version raised to 0.1.1, as a
release of it would be: both trees say 0.1.0), which migrates the store while the old leader keeps using it; then
the leader is stopped with SIGTERM (it drains its gateway and releases the lease) so the upgraded standby leads;
then the old leader starts again on the new code. No request fails (a refusal before it started, as `sdk_clients`
counts them, is allowed), every answered request is billed once, and the new leader runs 0.1.1 with the agent
connected to it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import psycopg
import pytest
import trio

from llmgw.settings import init_repository
from support.haproxy import server_stats, start_haproxy, stop_clients_and_proxy
from support.llmgw_processes import LlmgwProcesses
from support.postgres import postgres_schema, schema_url
from support.previous_release import PREVIOUS_RELEASE, previous_tree, raised_tree, run_previous
from support.sdk_clients import CLIENT_ROWS, SdkClients, billing_problems
from support.serving_process import free_port
from support.settings_seed import projects_yaml
from support.waiting import wait_for

from .conftest import write_seed

NEW_VERSION = "0.1.1"
LEASE = "3s"

MAKE_KEY = """
import sys
from llmgw.store import open_store
store = open_store(sys.argv[1])
print(store.create_api_key("demo")[1])
store.close()
"""


class Plane:
    """One control plane by its fixed ports (kept across its restarts, as haproxy and the agent know them)."""

    def __init__(self, root: Path, name: str):
        self.name, self.state = name, root / name
        self.ports = {kind: free_port() for kind in ("gateway", "admin", "agents")}

    def args(self, repo: Path, store: str) -> list[str]:
        return ["server", "--repo", str(repo), "--state", str(self.state), "--store", store, "--lease", LEASE,
                *[a for kind, port in self.ports.items() for a in (f"--{kind}", f"127.0.0.1:{port}")]]

    def health(self) -> dict:
        """The admin API's unauthenticated health: {"ok", "leader", "leader_holder", "fleet"}."""
        return httpx.get(f"http://127.0.0.1:{self.ports['admin']}/api/v1/health", timeout=5).json()

    def serving(self) -> bool:
        """Whether its gateway's /health is 200 (it has its fleet back: haproxy sends it requests)."""
        return httpx.get(f"http://127.0.0.1:{self.ports['gateway']}/health", timeout=5).status_code == 200

    def admin(self, path: str) -> httpx.Response:
        token = (self.state / "admin-token").read_text().strip()
        reply = httpx.get(f"http://127.0.0.1:{self.ports['admin']}{path}", timeout=10,
                          headers={"Authorization": f"Bearer {token}"})
        reply.raise_for_status()
        return reply

    def status(self) -> dict:
        return self.admin("/api/v1/status").json()

    def answered(self) -> float:
        """The requests its gateway answered 200 since it started (its /metrics)."""
        return sum(float(line.rsplit(" ", 1)[1]) for line in self.admin("/metrics").text.splitlines()
                   if line.startswith("llmgw_gateway_requests_total{") and 'status="200"' in line)


@pytest.mark.slow
def test_the_standby_upgraded_first_then_the_handover_lose_no_request(tmp_path, weights_mirror, fake_engine):
    started = time.monotonic()
    previous, new = previous_tree(tmp_path / "previous"), raised_tree(tmp_path / "new", NEW_VERSION)
    mirror, sha = weights_mirror
    seed = write_seed(tmp_path / "seed", sha)
    (seed / "projects.yaml").write_text(projects_yaml({"demo": {"models": ["tiny"]}}))
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    procs = LlmgwProcesses(tmp_path)
    leader, standby = Plane(tmp_path, "cp0"), Plane(tmp_path, "cp1")
    proxy, clients = None, None

    def log(plane: Plane) -> str:
        return (tmp_path / f"{plane.name}.log").read_text()[-3000:]

    def stop(plane: Plane) -> None:
        """SIGTERM, as systemd stops it: it drains its gateway, releases the lease if it holds it, exits 0."""
        proc = procs.procs[plane.name]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log(plane)

    with postgres_schema() as schema:
        store = schema_url(schema)
        try:
            procs.spawn(leader.name, *leader.args(repo, store), tree=previous)
            wait_for(lambda: leader.health()["leader"], 60, "the first control plane to lead", lambda: log(leader))
            procs.spawn(standby.name, *standby.args(repo, store), tree=previous)
            wait_for(lambda: standby.health()["ok"], 60, "the standby", lambda: log(standby))
            procs.spawn("n1", "agent", *[a for p in (leader, standby)
                                         for a in ("--control-plane", f"127.0.0.1:{p.ports['agents']}")],
                        "--node-id", "n1", "--state-dir", str(tmp_path / "n1"), "--mirror", str(mirror),
                        "--heartbeat-interval", "200ms", "--insecure",
                        "--engine-binary", f"llama.cpp@b11434={fake_engine}", "--stop-shards-on-exit", tree=previous)
            for plane in (leader, standby):
                wait_for(lambda p=plane: p.status()["replicas"]["tiny-0"]["state"] == "ready" and p.serving(), 90,
                         f"tiny-0 ready as {plane.name} sees it", lambda p=plane: log(p))
            assert {p.status()["control_plane"]["version"] for p in (leader, standby)} == {"0.1.0"}
            key = run_previous(previous, MAKE_KEY, store).strip()  # the previous release's store, not migrated yet
            proxy, front = start_haproxy(tmp_path, [f"http://127.0.0.1:{p.ports['gateway']}" for p in (leader,
                                                                                                        standby)])
            clients = SdkClients(f"{front}/v1", key, 16, model="tiny", max_tokens=8).start()
            clients.answers_after(32, 60, "through haproxy before the upgrade")
            figures = [f"before: {clients.figures()}"]

            # 1. the standby: stopped, started again on the new code (it migrates the store; the leader goes on)
            stop(standby)
            procs.spawn(standby.name, *standby.args(repo, store), tree=new)
            wait_for(standby.serving, 90, "the upgraded standby to have its fleet back", lambda: log(standby))
            assert not standby.health()["leader"]
            assert standby.status()["control_plane"]["version"] == NEW_VERSION
            # haproxy checks every 2 s: the standby must be UP there before the leader goes away (else it has no
            # server for a moment and answers 503 itself: seen once the clients' answers came faster than a check)
            wait_for(lambda: trio.run(server_stats, front)["g1"]["status"] == "UP", 30, "haproxy to see the standby UP")
            clients.answers_after(32, 60, "with the standby upgraded")
            figures.append(f"standby upgraded: {clients.figures()}")

            # 2. the handover: the leader stopped with SIGTERM releases the lease, the upgraded standby takes it
            sent = time.monotonic()
            procs.procs[leader.name].send_signal(signal.SIGTERM)
            wait_for(lambda: standby.health()["leader"], 30, "the upgraded standby to lead", lambda: log(standby))
            handover = time.monotonic() - sent
            assert procs.procs[leader.name].wait(timeout=60) == 0, log(leader)
            stopped = time.monotonic() - sent
            clients.answers_after(32, 60, "after the handover")
            figures.append(f"handover: {clients.figures()}")

            # 3. the old leader: started again on the new code, now a standby
            procs.spawn(leader.name, *leader.args(repo, store), tree=new)
            wait_for(leader.serving, 90, "the old leader back on the new code", lambda: log(leader))
            clients.answers_after(32, 60, "with both control planes upgraded")
            wait_for(lambda: leader.answered() >= 16, 60, "haproxy to send the old leader requests again")
            led, stands_by = standby.status(), leader.status()
        finally:
            stop_clients_and_proxy(clients, proxy)
            procs.stop()
        figures.append(f"end: {clients.figures()}")
        with psycopg.connect(store, autocommit=True) as conn:
            rows = list(conn.execute(CLIENT_ROWS))
    print(f"control plane upgrade from {PREVIOUS_RELEASE[:12]}: the upgraded standby led {handover:.2f} s after "
          f"the leader's SIGTERM (it exited after {stopped:.2f} s); {'; '.join(figures)}; "
          f"{len(rows)} usage rows; {time.monotonic() - started:.1f} s in all; refused: {clients.refused[:3]}")
    assert led["control_plane"]["leader"] and led["control_plane"]["version"] == NEW_VERSION
    assert not stands_by["control_plane"]["leader"] and stands_by["control_plane"]["version"] == NEW_VERSION
    node = led["nodes"]["n1"]
    assert node["state"] == "connected" and node["agent_version"] == "0.1.0", node
    assert led["replicas"]["tiny-0"]["state"] == "ready"
    assert not clients.failed, (clients.figures(), clients.failed[:5])
    problems = billing_problems(clients, rows)
    assert not problems, problems[:10]

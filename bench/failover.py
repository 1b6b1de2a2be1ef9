"""Failover of the control plane: time from SIGKILL of the leader to the first command of the new leader.

Three `llmgw server` processes share one PostgreSQL schema (created in `--postgres`'s database and dropped at the
end); two `llmgw agent` processes (the llama-server stand-in of tests/support) connect to all three. A client
sends chat completions round robin to the live gateways the whole time. Each round SIGKILLs the leader; the time
is until an agent has received a command from the new leader (its `<state>/fencing-token` file holds the new
lease's token: `llmgw.agent.fencing` writes it when the first command with that token arrives); the killed control
plane is then started again on its state directory (it comes back as a standby and writes what its usage spool
held). At the end: requests answered and failed, and usage rows in the store against answered requests.

    .venv/bin/python bench/failover.py [--rounds 5] [--lease 15s] [--postgres postgresql://127.0.0.1:5432/test]

The leader renews every third of the lease and a standby tries as often, so a takeover lands between the lease's
end and a third of a lease later: the `--lease` default of 15 s gives 10-20 s; 6 s or less meets the 10 s target.

The client sends only to gateways whose `GET /health` answered 200 at the last check (every 0.5 s, as haproxy's
`option httpchk` would): a control plane started again says 503 "recovering" until its agents are back
(llmgw.control.recovering), so requests do not meet a gateway that knows no replica yet.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psycopg
import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from control.conftest import FAKE_SERVER, write_seed  # noqa: E402
from support.llmgw_processes import LlmgwProcesses  # noqa: E402

from llmgw.settings import init_repository  # noqa: E402
from llmgw.store import open_store  # noqa: E402
from llmgw.units import parse_duration  # noqa: E402


class Cluster(LlmgwProcesses):
    def __init__(self, root: Path, url: str, lease: str):
        super().__init__(root)
        self.url, self.lease = url, lease
        self.admin: dict[int, httpx.Client] = {}
        self.gateways: dict[int, str] = {}
        self.agent_ports = [free_port() for _ in range(3)]  # kept across restarts: the agents know these

    def start_plane(self, i: int, repo: Path) -> dict:
        state = self.root / f"cp{i}"
        (state / "admin-url").unlink(missing_ok=True)
        self.gateways.pop(i, None)  # the client sends to it again once it listens
        self.spawn(f"cp{i}", "server", "--repo", str(repo), "--state", str(state), "--store", self.url,
                   "--gateway", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--agents", f"127.0.0.1:{self.agent_ports[i]}",
                   "--lease", self.lease)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                client = httpx.Client(base_url=(state / "admin-url").read_text().strip(), timeout=5, headers={
                    "Authorization": f"Bearer {(state / 'admin-token').read_text().strip()}"})
                doc = client.get("/api/v1/status").json()
                self.admin[i], self.gateways[i] = client, doc["control_plane"]["gateway_url"]
                return doc
            except (FileNotFoundError, httpx.TransportError, ValueError, KeyError):
                time.sleep(0.1)
        raise SystemExit(f"control plane {i} did not start; see {self.root}/cp{i}.log")

    def alive(self, i: int) -> bool:
        return self.procs[f"cp{i}"].poll() is None

    def leader(self) -> int | None:
        leads = []
        for i, client in self.admin.items():
            try:
                if self.alive(i) and client.get("/api/v1/health").json()["leader"]:
                    leads.append(i)
            except (httpx.TransportError, ValueError):
                pass
        return leads[0] if len(leads) == 1 else None


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise SystemExit(f"timed out after {timeout} s waiting for {what}")


def token_seen(root: Path) -> int:
    tokens = []
    for node in ("n1", "n2"):
        try:
            tokens.append(int((root / node / "fencing-token").read_text()))
        except (FileNotFoundError, ValueError):
            tokens.append(0)
    return max(tokens)


async def check_health(cluster: Cluster, healthy: set[int], done: trio.Event) -> None:
    """Every 0.5 s: `healthy` := the live control planes whose gateway's /health answers 200 (a proxy's check)."""
    async with httpx.AsyncClient(timeout=1) as client:
        while not done.is_set():
            for i, gateway in list(cluster.gateways.items()):
                try:
                    ok = cluster.alive(i) and (await client.get(f"{gateway}/health")).status_code == 200
                except httpx.TransportError:
                    ok = False
                (healthy.add if ok else healthy.discard)(i)
            await trio.sleep(0.5)


async def load(cluster: Cluster, key: str, counts: dict, done: trio.Event) -> None:
    healthy: set[int] = set()
    async with httpx.AsyncClient(timeout=10) as client, trio.open_nursery() as nursery:
        nursery.start_soon(check_health, cluster, healthy, done)
        n = 0
        while not done.is_set():
            live = ([g for i, g in list(cluster.gateways.items()) if i in healthy and cluster.alive(i)]
                    or [g for i, g in list(cluster.gateways.items()) if cluster.alive(i)])
            n += 1
            try:
                reply = await client.post(f"{live[n % len(live)]}/v1/chat/completions",
                                          headers={"Authorization": f"Bearer {key}"},
                                          json={"model": "tiny", "max_tokens": 3,
                                                "messages": [{"role": "user", "content": "hi"}]})
                counts["ok" if reply.status_code == 200 else "failed"] += 1
                if reply.status_code != 200:
                    why = f"{reply.status_code} {reply.json().get('error', {}).get('message', '')[:60]}"
                    counts["why"][why] = counts["why"].get(why, 0) + 1
            except httpx.TransportError as exc:
                counts["failed"] += 1
                counts["why"][type(exc).__name__] = counts["why"].get(type(exc).__name__, 0) + 1
            await trio.sleep(0.05)


async def main(args) -> None:
    schema = "llmgw_bench_failover_" + secrets.token_hex(4)
    with psycopg.connect(args.postgres, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = f"{args.postgres}?options=-csearch_path%3D{schema}"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = b"GGUF stand-in weights for the failover bench\n"
        sha = hashlib.sha256(data).hexdigest()
        (root / "mirror" / "sha256").mkdir(parents=True)
        (root / "mirror" / "sha256" / sha).write_bytes(data)
        engine = root / "fake-llama-server"
        engine.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_SERVER} \"$@\"\n")
        engine.chmod(0o755)
        repo = root / "settings.git"
        init_repository(repo, write_seed(root / "seed", sha))
        cluster = Cluster(root, url, args.lease)
        times: list[float] = []
        counts = {"ok": 0, "failed": 0, "why": {}}
        try:
            docs = [cluster.start_plane(i, repo) for i in range(3)]
            for node in ("n1", "n2"):
                cluster.spawn(node, "agent", *[a for d in docs for a in
                                               ("--control-plane", f"127.0.0.1:{d['control_plane']['agents_port']}")],
                              "--node-id", node, "--state-dir", str(root / node), "--mirror", str(root / "mirror"),
                              "--heartbeat-interval", "200ms", "--insecure",
                              "--engine-binary", f"llama.cpp@b11434={engine}", "--stop-shards-on-exit")
            wait(lambda: cluster.leader() is not None and cluster.admin[cluster.leader()].get("/api/v1/status")
                 .json()["replicas"].get("tiny-0", {}).get("state") == "ready", 90, "tiny-0 ready")
            store = open_store(url)
            _record, key = store.create_api_key("demo")
            done = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(load, cluster, key, counts, done)
                for round_ in range(args.rounds):
                    old = await trio.to_thread.run_sync(
                        lambda: wait(lambda: cluster.leader() is not None, 60, "a leader") and cluster.leader())
                    seen = await trio.to_thread.run_sync(
                        lambda: wait(lambda: token_seen(root), 60, "a command with the leader's token"))
                    await trio.sleep(2.0)  # under load for a while
                    cluster.procs[f"cp{old}"].send_signal(signal.SIGKILL)
                    killed = time.monotonic()
                    await trio.to_thread.run_sync(lambda: wait(lambda: token_seen(root) > seen, 120,
                                                               "the new leader's first command"))
                    times.append(time.monotonic() - killed)
                    print(f"round {round_ + 1}: the new leader's first command reached an agent "
                          f"{times[-1]:.2f} s after the SIGKILL", flush=True)
                    await trio.to_thread.run_sync(cluster.start_plane, old, repo)
                done.set()
            await trio.sleep(1.0)
            deadline = time.monotonic() + 30
            rows = 0
            while time.monotonic() < deadline:  # rows of answered requests (failed ones are recorded with their status)
                with psycopg.connect(url, autocommit=True) as conn:
                    rows = conn.execute("SELECT count(*) FROM usage WHERE project = 'demo' AND status = 200"
                                        ).fetchone()[0]
                if rows >= counts["ok"]:
                    break
                time.sleep(0.5)
            store.close()
        finally:
            cluster.stop()
            with psycopg.connect(args.postgres, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
    print(f"\nlease {args.lease}, {args.rounds} rounds: SIGKILL -> first command of the new leader "
          f"mean {statistics.mean(times):.2f} s, min {min(times):.2f} s, max {max(times):.2f} s")
    print(f"requests: {counts['ok']} answered, {counts['failed']} failed; usage rows of answered requests {rows} "
          f"(lost: {max(0, counts['ok'] - rows)}, extra: {max(0, rows - counts['ok'])})")
    for why, count in sorted(counts["why"].items(), key=lambda item: -item[1]):
        print(f"  failed {count:4d}: {why}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lease", default="15s", help="the leader lease (llmgw server --lease)")
    parser.add_argument("--postgres", default=os.environ.get("LLMGW_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test"))
    arguments = parser.parse_args()
    parse_duration(arguments.lease)
    trio.run(main, arguments)

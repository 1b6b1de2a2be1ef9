"""Failover as processes: three `llmgw server`s on one PostgreSQL database, two `llmgw agent`s with the llama-server
stand-in, each agent connected to every control plane (and to a test-side stand-in for a deposed leader). SIGKILL
the leader under load, then check: a standby commands afterwards, no replica is placed twice, the deposed leader's
late command is refused, no usage row is lost, and requests-per-minute 100 across two gateways with 300 attempts
gives at most 100 successes."""

from __future__ import annotations

import os
import secrets
import signal
from collections import Counter
from pathlib import Path

import httpx
import psycopg
import pytest
import trio

from llmgw.store import open_store
from llmgw.wire import control_message, pb, serve_agents

from support.llmgw_processes import LlmgwProcesses
from support.settings_seed import projects_yaml

from .conftest import git, write_seed

POSTGRES_URL = os.environ.get("LLMGW_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")
LEASE = 3.0
PROJECTS = projects_yaml({"demo": {"models": ["tiny"]},
                          "limited": {"models": ["tiny"], "quota": {"requests_per_minute": 100}}})


@pytest.fixture
def postgres_url():
    """A schema of its own in the test database (dropped at the end), as a store URL."""
    schema = "llmgw_failover_" + secrets.token_hex(5)
    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


async def wait_for(check, timeout: float, what: str):
    deadline = trio.current_time() + timeout
    while trio.current_time() < deadline:
        try:
            value = await check()
        except (httpx.TransportError, KeyError, FileNotFoundError, ValueError):
            value = None
        if value:
            return value
        await trio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Plane:
    """One `llmgw server` as the test reaches it: its admin API (with its token) and its gateway."""

    def __init__(self, state: Path):
        self.state = state
        self.client: httpx.AsyncClient | None = None

    async def connect(self) -> dict:
        url = (self.state / "admin-url").read_text().strip()
        token = (self.state / "admin-token").read_text().strip()
        self.client = httpx.AsyncClient(base_url=url, timeout=5, headers={"Authorization": f"Bearer {token}"})
        return await self.status()

    async def status(self) -> dict:
        reply = await self.client.get("/api/v1/status")
        reply.raise_for_status()
        return reply.json()

    async def health(self) -> dict:
        return (await self.client.get("/api/v1/health")).json()


def shards_of(status: dict, replica: str) -> list[tuple[str, str, int | None]]:
    """(node, shard id, engine pid) of every shard of `replica` on any node."""
    return [(node, shard_id, shard.get("pid")) for node, doc in status["nodes"].items()
            for shard_id, shard in doc["shards"].items() if shard["replica"] == replica]


@pytest.mark.slow
async def test_a_standby_takes_over_from_a_killed_leader_and_nothing_is_placed_twice_refused_late_or_lost(
    tmp_path, postgres_url, weights_mirror, fake_engine,
):
    mirror, sha = weights_mirror
    seed = write_seed(tmp_path / "seed", sha)
    (seed / "projects.yaml").write_text(PROJECTS)
    from llmgw.settings import init_repository

    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    procs = LlmgwProcesses(tmp_path)
    late_links: dict[str, object] = {}
    results_send, results = trio.open_memory_channel(100)

    async def deposed_leader(link, peer):  # the test's stand-in for a leader whose commands arrive late
        first = await link.receive()
        late_links[first.register.node_id] = link
        async for message in link:
            if message.WhichOneof("body") == "command_result":
                await results_send.send(message.command_result)

    try:
        async with trio.open_nursery() as nursery:
            late_port = await nursery.start(serve_agents, deposed_leader, "127.0.0.1", 0)
            planes = [Plane(tmp_path / f"cp{i}") for i in range(3)]
            for i, plane in enumerate(planes):
                procs.spawn(f"cp{i}", "server", "--repo", str(repo), "--state", str(plane.state), "--store",
                            postgres_url, "--gateway", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--agents",
                            "127.0.0.1:0", "--lease", f"{LEASE}s")
            docs = [await wait_for(plane.connect, 60, f"control plane {i}") for i, plane in enumerate(planes)]
            addresses = [f"127.0.0.1:{doc['control_plane']['agents_port']}" for doc in docs]
            gateways = [doc["control_plane"]["gateway_url"] for doc in docs]
            for node in ("n1", "n2"):
                procs.spawn(node, "agent", *[a for address in addresses for a in ("--control-plane", address)],
                            "--control-plane", f"127.0.0.1:{late_port}", "--node-id", node, "--state-dir",
                            str(tmp_path / node), "--mirror", str(mirror), "--heartbeat-interval", "200ms",
                            "--insecure", "--engine-binary", f"llama.cpp@b11434={fake_engine}",
                            "--stop-shards-on-exit", "--no-bandwidth-probe")

            async def leader_index() -> int | None:
                leads = [i for i, p in enumerate(planes) if procs.procs[f"cp{i}"].poll() is None
                         and (await p.health())["leader"]]
                return leads[0] + 1 if len(leads) == 1 else None

            old = await wait_for(leader_index, 30, "one leader") - 1
            standbys = [i for i in range(3) if i != old]

            async def tiny_ready_everywhere() -> bool:
                for i in range(3):
                    doc = await planes[i].status()
                    if doc["replicas"].get("tiny-0", {}).get("state") != "ready":
                        return False
                return True

            await wait_for(tiny_ready_everywhere, 60, "tiny-0 ready, as every control plane sees it")
            before = await planes[old].status()
            old_token = before["control_plane"]["leader_token"]
            [(tiny_node, tiny_shard, tiny_pid)] = shards_of(before, "tiny-0")
            await wait_for(lambda: trio.to_thread.run_sync(lambda: len(late_links) == 2), 20, "both agents on the stand-in")

            store = await trio.to_thread.run_sync(open_store, postgres_url)
            _record, demo_key = store.create_api_key("demo")
            _record, limited_key = store.create_api_key("limited")

            answered_ids: set[str] = set()  # the client's x-request-id of each request answered 200
            refused: dict[str, int] = {}  # ... of each answered another status: the status
            lost: set[str] = set()  # ... of each whose answer the client never got (in flight on the killed gateway)
            load_done = trio.Event()
            load_ended = trio.Event()

            async def load() -> None:  # requests to every live gateway, round robin, until told to stop
                async with httpx.AsyncClient(timeout=10) as client:
                    n = 0
                    while not load_done.is_set():
                        live = [g for i, g in enumerate(gateways) if procs.procs[f"cp{i}"].poll() is None]
                        gateway = live[n % len(live)]
                        n += 1
                        request_id = f"failover-{n}"
                        try:
                            reply = await client.post(f"{gateway}/v1/chat/completions",
                                                      headers={"Authorization": f"Bearer {demo_key}",
                                                               "x-request-id": request_id},
                                                      json={"model": "tiny", "max_tokens": 3,
                                                            "messages": [{"role": "user", "content": "hi"}]})
                            if reply.status_code == 200:
                                answered_ids.add(request_id)
                            else:
                                refused[request_id] = reply.status_code
                        except httpx.TransportError:
                            lost.add(request_id)
                        await trio.sleep(0.02)
                load_ended.set()

            nursery.start_soon(load)
            await wait_for(lambda: trio.to_thread.run_sync(lambda: len(answered_ids) >= 20), 20, "20 answers")
            procs.procs[f"cp{old}"].send_signal(signal.SIGKILL)
            killed_at = trio.current_time()
            new = await wait_for(leader_index, 30, "a standby to lead") - 1
            assert new in standbys
            took_over = trio.current_time() - killed_at

            # the new leader commands: a second replica placed and ready
            checkout = tmp_path / "checkout"
            await trio.to_thread.run_sync(lambda: git("clone", "-q", str(repo), str(checkout), cwd=tmp_path))
            tiny = checkout / "catalog" / "tiny.yaml"
            tiny.write_text(tiny.read_text().replace("replicas: 1", "replicas: 2"))
            await trio.to_thread.run_sync(lambda: git("commit", "-qam", "tiny: 2 replicas", cwd=checkout))
            await trio.to_thread.run_sync(lambda: git("push", "-q", "origin", "HEAD:main", cwd=checkout))

            async def second_replica_ready() -> dict | None:
                doc = await planes[new].status()
                return doc if doc["replicas"].get("tiny-1", {}).get("state") == "ready" else None

            after = await wait_for(second_replica_ready, 60, "tiny-1 ready via the new leader")
            assert after["control_plane"]["leader_token"] > old_token
            # nothing placed twice: tiny-0 kept its one engine, each replica has one shard
            assert shards_of(after, "tiny-0") == [(tiny_node, tiny_shard, tiny_pid)] and tiny_pid
            assert len(shards_of(after, "tiny-1")) == 1

            # the deposed leader's late command is refused, and changes nothing
            late = late_links[tiny_node]
            await late.send(control_message(command_id="late-stop", fencing_token=old_token,
                                            stop_shard=pb.StopShard(shard_id=tiny_shard)))
            with trio.fail_after(10):
                while (result := await results.receive()).command_id != "late-stop":
                    pass
            assert not result.ok and "deposed leader" in result.error
            await trio.sleep(1.0)
            assert (await planes[new].status())["replicas"]["tiny-0"]["state"] == "ready"

            load_done.set()
            with trio.fail_after(15):  # its last request answered (or lost)
                await load_ended.wait()

            # the killed control plane starts again on its state directory: its spool's usage is written once
            procs.spawn(f"cp{old}", "server", "--repo", str(repo), "--state", str(planes[old].state), "--store",
                        postgres_url, "--gateway", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--agents",
                        "127.0.0.1:0", "--lease", f"{LEASE}s")
            await wait_for(planes[old].connect, 60, "the old leader back")
            assert not (await planes[old].health())["leader"]

            def usage_rows() -> Counter:
                """Usage rows per client request id."""
                return Counter(row.client_request_id for row in store.recent_usage(project="demo", limit=100_000))

            await wait_for(lambda: trio.to_thread.run_sync(lambda: answered_ids <= set(usage_rows())), 20,
                           "every answered request's usage row")
            rows = await trio.to_thread.run_sync(usage_rows)
            assert [rid for rid, count in rows.items() if count > 1] == []  # none twice
            assert answered_ids <= set(rows)  # none lost
            # a request may be billed whose answer its client never got: served, spooled, then its gateway killed
            # before the answer went out (the killed leader's spool is written when it starts again)
            assert set(rows) - answered_ids <= lost | set(refused)

            # requests per minute 100 across two gateways: 300 attempts, at most 100 answered
            answered = 0

            async def attempt(client: httpx.AsyncClient, gateway: str) -> None:
                nonlocal answered
                reply = await client.post(f"{gateway}/v1/chat/completions",
                                          headers={"Authorization": f"Bearer {limited_key}"},
                                          json={"model": "tiny", "max_tokens": 1,
                                                "messages": [{"role": "user", "content": "hi"}]})
                assert reply.status_code in (200, 429), reply.text
                answered += reply.status_code == 200

            limiter = trio.CapacityLimiter(16)
            two = [gateways[i] for i in standbys]
            async with httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as burst:
                async def one(k: int) -> None:
                    async with limiter:
                        await attempt(client, two[k % 2])
                for k in range(300):
                    burst.start_soon(one, k)
            assert 90 <= answered <= 100
            print(f"failover: a standby led {took_over:.1f} s after the SIGKILL (lease {LEASE} s); "
                  f"{len(answered_ids)} answered, {len(refused)} refused {sorted(set(refused.values()))}, {len(lost)} "
                  f"lost with their gateway, {len(set(rows) - answered_ids)} of those billed, during the load")
            store.close()
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(procs.stop)

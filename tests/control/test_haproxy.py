"""haproxy (Debian's package, installed by `make system-packages`) in front of `llmgw server` gateways on loopback,
health-checking each one's /health: after one gateway is SIGKILLed, no request that arrives fails; and three control
planes on one PostgreSQL database, asked through haproxy with the official openai SDK, lose no request and no usage
row while the leader is SIGKILLed and started again (haproxy sends the restarted one nothing while its /health says
it is recovering its fleet)."""

from __future__ import annotations

import signal

import httpx
import openai
import pytest
import trio

from llmgw.store import open_store

from .conftest import write_seed
from support.haproxy import server_stats, start_haproxy
from support.serving_process import free_port
from support.llmgw_processes import LlmgwProcesses

from .test_failover import Plane, postgres_url, wait_for  # noqa: F401 - postgres_url is a fixture

@pytest.mark.slow
async def test_after_one_gateway_is_killed_no_request_through_haproxy_fails(tmp_path, weights_mirror, fake_engine):
    mirror, sha = weights_mirror
    seed = write_seed(tmp_path / "seed", sha)
    from llmgw.settings import init_repository

    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    store_path = tmp_path / "shared.sqlite3"
    procs = LlmgwProcesses(tmp_path)
    proxy = None
    try:
        planes = [Plane(tmp_path / f"cp{i}") for i in range(2)]
        for i, plane in enumerate(planes):
            procs.spawn(f"cp{i}", "server", "--repo", str(repo), "--state", str(plane.state), "--store",
                        str(store_path), "--gateway", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--agents",
                        "127.0.0.1:0", "--lease", "3s")
        docs = [await wait_for(plane.connect, 60, f"control plane {i}") for i, plane in enumerate(planes)]
        procs.spawn("n1", "agent", *[a for doc in docs for a in
                                     ("--control-plane", f"127.0.0.1:{doc['control_plane']['agents_port']}")],
                    "--node-id", "n1", "--state-dir", str(tmp_path / "n1"), "--mirror", str(mirror),
                    "--heartbeat-interval", "200ms", "--insecure", "--no-bandwidth-probe",
                    "--engine-binary", f"llama.cpp@b11434={fake_engine}", "--stop-shards-on-exit")

        async def routed_everywhere() -> bool:
            states = [(await p.status())["replicas"].get("tiny-0", {}).get("state") for p in planes]
            return states == ["ready", "ready"]

        await wait_for(routed_everywhere, 60, "tiny-0 ready on both control planes")
        gateways = [doc["control_plane"]["gateway_url"] for doc in docs]
        proxy, front = start_haproxy(tmp_path, gateways)
        store = await trio.to_thread.run_sync(open_store, str(store_path))
        _record, key = store.create_api_key("demo")
        store.close()

        async with httpx.AsyncClient(base_url=front, timeout=10,
                                     headers={"Authorization": f"Bearer {key}"}) as client:
            async def ask() -> int:
                reply = await client.post("/v1/chat/completions", json={
                    "model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
                return reply.status_code

            async def answering() -> bool:
                return await ask() == 200

            await wait_for(answering, 20, "haproxy to answer")
            before = [await ask() for _ in range(20)]
            assert before == [200] * 20
            procs.procs["cp0"].send_signal(signal.SIGKILL)
            procs.procs["cp0"].wait()  # gone: a request sent before it died would be in flight, which may fail
            after = []
            for _ in range(100):  # each request arrives after the kill, some of them before haproxy's check saw it
                after.append(await ask())
                await trio.sleep(0.01)
        assert after == [200] * 100
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(timeout=10)
        await trio.to_thread.run_sync(procs.stop)



@pytest.mark.slow
async def test_three_control_planes_on_postgresql_through_haproxy_lose_no_request_when_the_leader_restarts(
    tmp_path, postgres_url, weights_mirror, fake_engine,  # noqa: F811 - the fixture imported above
):
    mirror, sha = weights_mirror
    seed = write_seed(tmp_path / "seed", sha)
    from llmgw.settings import init_repository

    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    procs = LlmgwProcesses(tmp_path)
    planes = [Plane(tmp_path / f"cp{i}") for i in range(3)]
    ports = [{name: free_port() for name in ("gateway", "admin", "agents")} for _ in planes]  # kept across restarts

    def start(i: int) -> None:
        procs.spawn(f"cp{i}", "server", "--repo", str(repo), "--state", str(planes[i].state), "--store", postgres_url,
                    "--lease", "3s", *[a for name, port in ports[i].items() for a in (f"--{name}", f"127.0.0.1:{port}")])

    proxy = None
    try:
        for i in range(3):
            start(i)
        for i, plane in enumerate(planes):
            await wait_for(plane.connect, 60, f"control plane {i}")
        for node in ("n1", "n2"):
            procs.spawn(node, "agent", *[a for p in ports for a in ("--control-plane", f"127.0.0.1:{p['agents']}")],
                        "--node-id", node, "--state-dir", str(tmp_path / node), "--mirror", str(mirror),
                        "--heartbeat-interval", "200ms", "--insecure", "--reconnect-backoff-max", "500ms",
                        "--no-bandwidth-probe", "--engine-binary", f"llama.cpp@b11434={fake_engine}", "--stop-shards-on-exit")

        async def routed_everywhere() -> bool:
            states = [(await p.status())["replicas"].get("tiny-0", {}).get("state") for p in planes]
            return states == ["ready"] * 3

        await wait_for(routed_everywhere, 60, "tiny-0 ready on every control plane")
        leader = await wait_for(lambda: _leader(planes), 30, "one leader")
        proxy, front = start_haproxy(tmp_path, [f"http://127.0.0.1:{p['gateway']}" for p in ports])
        store = await trio.to_thread.run_sync(open_store, postgres_url)
        _record, key = store.create_api_key("demo")
        client = openai.OpenAI(base_url=f"{front}/v1", api_key=key, max_retries=0, timeout=10)

        def ask() -> str:
            try:
                reply = client.chat.completions.create(model="tiny", max_tokens=3,
                                                       messages=[{"role": "user", "content": "hi"}])
            except openai.APIError as exc:
                return f"{type(exc).__name__}: {exc}"
            return "ok" if reply.usage.completion_tokens >= 1 else f"no usage: {reply}"

        await wait_for(lambda: trio.to_thread.run_sync(lambda: ask() == "ok"), 20, "haproxy to answer")
        answers: list[str] = []
        done = trio.Event()

        async def load() -> None:  # one request at a time: at most one is in flight on the killed gateway
            while not done.is_set():
                answers.append(await trio.to_thread.run_sync(ask))
                await trio.sleep(0.01)

        killed = f"g{leader - 1}"  # the leader's gateway, as haproxy names it
        async with trio.open_nursery() as nursery:
            nursery.start_soon(load)
            await wait_for(lambda: trio.to_thread.run_sync(lambda: answers.count("ok") >= 20), 20, "20 answers")
            procs.procs[f"cp{leader - 1}"].send_signal(signal.SIGKILL)
            killed_at = len(answers)
            await wait_for(lambda: trio.to_thread.run_sync(lambda: len(answers) >= killed_at + 20), 20,
                           "20 answers after the kill")
            served_before = int((await server_stats(front))[killed]["hrsp_2xx"])
            start(leader - 1)  # the same ports: haproxy and the agents know them

            async def back() -> bool:
                async with httpx.AsyncClient(timeout=5) as raw:
                    reply = await raw.get(f"http://127.0.0.1:{ports[leader - 1]['gateway']}/health")
                return reply.status_code == 200

            await wait_for(back, 60, "the restarted control plane to have its fleet back")

            async def serving_again() -> bool:  # haproxy's checks (every 2 s) see it up and send it requests again
                row = (await server_stats(front))[killed]
                return row["status"] == "UP" and int(row["hrsp_2xx"]) >= served_before + 5

            await wait_for(serving_again, 30, "haproxy to send the restarted gateway requests again")
            done.set()
        failed = [(n, a) for n, a in enumerate(answers) if a != "ok"]
        # only the request in flight at the SIGKILL may fail; none after it, also while the leader was restarting
        assert len(failed) <= 1 and all(n <= killed_at + 1 for n, _a in failed), failed
        assert len(answers) > 50
        answered = len(answers) - len(failed) + 1  # and the one that found haproxy answering

        def usage() -> int:
            return sum(row.requests for row in store.query_usage(project="demo"))

        # every gateway writes its usage rows within a moment (the killed one's spool when it started again, long
        # before this)
        await wait_for(lambda: trio.to_thread.run_sync(lambda: usage() >= answered), 20, "every answer's usage row")
        assert answered <= usage() <= answered + len(failed)  # none lost; the failed one billed at most once
        store.close()
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(timeout=10)
        await trio.to_thread.run_sync(procs.stop)


async def _leader(planes: list[Plane]) -> int | None:
    """1 + the index of the one plane whose admin health says it leads, else None."""
    leads = [i for i, p in enumerate(planes) if (await p.health())["leader"]]
    return leads[0] + 1 if len(leads) == 1 else None

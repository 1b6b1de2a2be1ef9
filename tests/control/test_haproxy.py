"""haproxy (Debian's package, installed by `make system-packages`) in front of two `llmgw server` gateways on loopback,
health-checking each one's /health: after one gateway is SIGKILLed, no request that arrives fails."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess

import httpx
import pytest
import trio

from llmgw.store import open_store

from .conftest import write_seed
from .test_failover import Plane, Processes, wait_for

HAPROXY_CFG = """\
defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 30s
    retries 3
    option redispatch 1
    retry-on conn-failure
frontend llm
    bind 127.0.0.1:{port}
    default_backend gateways
backend gateways
    balance roundrobin
    option httpchk GET /health
    http-check expect status 200
{servers}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def haproxy_config(port: int, gateways: list[str]) -> str:
    # checks every 2 s: requests reach the killed gateway before a check sees it; `retry-on conn-failure` with
    # `option redispatch` sends each of them to the live one (with `retries 0` this test fails)
    servers = "\n".join(f"    server g{i} {url.removeprefix('http://')} check inter 2s fall 1 rise 1"
                        for i, url in enumerate(gateways))
    return HAPROXY_CFG.format(port=port, servers=servers)


@pytest.mark.slow
async def test_after_one_gateway_is_killed_no_request_through_haproxy_fails(tmp_path, weights_mirror, fake_engine):
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    assert shutil.os.path.exists(haproxy), "haproxy is not installed: run `make system-packages` (Debian package haproxy)"
    mirror, sha = weights_mirror
    seed = write_seed(tmp_path / "seed", sha)
    from llmgw.settings import init_repository

    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    store_path = tmp_path / "shared.sqlite3"
    procs = Processes(tmp_path)
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
                    "--heartbeat-interval", "200ms", "--insecure",
                    "--engine-binary", f"llama.cpp@b11434={fake_engine}", "--stop-shards-on-exit")

        async def routed_everywhere() -> bool:
            states = [(await p.status())["replicas"].get("tiny-0", {}).get("state") for p in planes]
            return states == ["ready", "ready"]

        await wait_for(routed_everywhere, 60, "tiny-0 ready on both control planes")
        gateways = [doc["control_plane"]["gateway_url"] for doc in docs]
        port = free_port()
        (tmp_path / "haproxy.cfg").write_text(haproxy_config(port, gateways))
        proxy = subprocess.Popen([haproxy, "-db", "-f", str(tmp_path / "haproxy.cfg")],
                                 stdout=open(tmp_path / "haproxy.log", "wb"), stderr=subprocess.STDOUT)
        store = await trio.to_thread.run_sync(open_store, str(store_path))
        _record, key = store.create_api_key("demo")
        store.close()

        front = f"http://127.0.0.1:{port}"
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


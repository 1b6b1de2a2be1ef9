"""haproxy (Debian's package, installed by `make system-packages`) in front of llmgw gateways, for the tests that
ask several control planes through one address (docs/ha.md, "One address for clients"): `start_haproxy(root,
gateway_urls)` returns its process and URL; each gateway health-checked on its /health."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx

from support.serving_process import free_port

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
    stats enable
    stats uri /haproxy-stats
    default_backend gateways
backend gateways
    balance roundrobin
    option httpchk GET /health
    http-check expect status 200
{servers}
"""


def haproxy_config(port: int, gateways: list[str]) -> str:
    """The configuration of haproxy on 127.0.0.1:`port` in front of `gateways` (http://HOST:PORT URLs)."""
    # checks every 2 s: requests reach a killed gateway before a check sees it; `retry-on conn-failure` with
    # `option redispatch` sends each of them to a live one (with `retries 0` tests/control/test_haproxy.py fails)
    servers = "\n".join(f"    server g{i} {url.removeprefix('http://')} check inter 2s fall 1 rise 1"
                        for i, url in enumerate(gateways))
    return HAPROXY_CFG.format(port=port, servers=servers)


async def server_stats(front: str) -> dict[str, dict[str, str]]:
    """haproxy's own view of the gateways behind `front` (its URL), from its CSV statistics page: {server name
    ("g0", ...): its row, e.g. "status" "UP" or "DOWN", "hrsp_2xx" the answers 2xx it passed on}."""
    async with httpx.AsyncClient(timeout=5) as client:
        reply = await client.get(f"{front}/haproxy-stats;csv")
    reply.raise_for_status()
    header, *rows = reply.text.lstrip("# ").splitlines()
    named = [dict(zip(header.split(","), row.split(","))) for row in rows if row]
    return {row["svname"]: row for row in named if row["pxname"] == "gateways"}


def start_haproxy(root: Path, gateways: list[str]) -> tuple[subprocess.Popen, str]:
    """haproxy in front of `gateways` (URLs), on a free loopback port, its configuration and log in `root`: (its
    process, its URL). Stop it with terminate()."""
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    assert os.path.exists(haproxy), "haproxy is not installed: run `make system-packages` (Debian package haproxy)"
    port = free_port()
    (root / "haproxy.cfg").write_text(haproxy_config(port, gateways))
    proxy = subprocess.Popen([haproxy, "-db", "-f", str(root / "haproxy.cfg")],
                             stdout=open(root / "haproxy.log", "wb"), stderr=subprocess.STDOUT)
    return proxy, f"http://127.0.0.1:{port}"


def stop_clients_and_proxy(clients, proxy: subprocess.Popen | None) -> None:
    """Stop `clients` (support.sdk_clients.SdkClients, or None) letting their requests in flight finish, then
    haproxy (or None)."""
    if clients is not None:
        clients.stop()
    if proxy is not None:
        proxy.terminate()
        proxy.wait(timeout=10)

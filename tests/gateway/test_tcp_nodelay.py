"""TCP_NODELAY on a gateway worker's sockets (issue 31 item 6), read with getsockopt from the worker process itself:
its socket to the client and its socket to the engine, in the middle of a stream (a real `llmgw.gateway.worker`
process; its file descriptors are copied with pidfd_getfd, Linux 5.6+)."""

from __future__ import annotations

import ctypes
import os
import socket

import httpx
import trio
from gateway_harness import make_table, replica, start_engine

from llmgw.gateway import GatewayWorkers

PIDFD_GETFD = 438  # the same number on x86_64 and aarch64 (the generic syscall table)


def tcp_sockets_of(pid: int) -> list[tuple[tuple, tuple, int]]:
    """(local address, peer address, TCP_NODELAY) of each connected TCP socket of process `pid`."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    found = []
    try:
        for entry in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{entry}").startswith("socket:"):
                    continue
            except OSError:
                continue
            fd = libc.syscall(PIDFD_GETFD, pidfd, int(entry), 0)
            assert fd >= 0, f"pidfd_getfd failed: errno {ctypes.get_errno()}"
            with socket.socket(fileno=fd) as sock:
                if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                    continue
                try:
                    peer = sock.getpeername()
                except OSError:  # the listening socket
                    continue
                found.append((sock.getsockname(), peer, sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
    finally:
        os.close(pidfd)
    return found


async def test_a_gateway_workers_client_and_upstream_sockets_have_tcp_nodelay(nursery, store, tmp_path):
    _engine, url = await start_engine(nursery, token_delay=0.1)
    engine_port = int(url.rsplit(":", 1)[1])
    workers = GatewayWorkers(1, "127.0.0.1", 0, store_url=str(store.path), spool_root=tmp_path / "spools",
                             metrics_dir=tmp_path / "metrics")
    with trio.fail_after(60):
        port = await nursery.start(workers.serve)
    workers.set_table(make_table({"gemma": [replica("gemma-1", url)]}))
    _key, plaintext = store.create_api_key("chat")
    base = f"http://127.0.0.1:{port}/v1"
    async with httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {plaintext}"}, timeout=30) as http:
        with trio.fail_after(10):
            while "gemma" not in (await http.get("/models")).text:  # the table reached the worker
                await trio.sleep(0.05)
        body = {"model": "gemma", "stream": True, "max_tokens": 40, "messages": [{"role": "user", "content": "Hi"}]}
        async with http.stream("POST", "/chat/completions", json=body) as response:
            seen = []
            lines = response.aiter_lines()  # held: a generator left behind would be closed, and the connection with it
            async for line in lines:
                seen.append(line)
                if line.startswith("data:") and '"content": "' in line:
                    break  # a token relayed, more to come (4 s of them): both connections are open
            for _attempt in range(20):  # polled: the worker's fd table is read while it runs
                sockets = await trio.to_thread.run_sync(tcp_sockets_of, workers.pids[0])
                client_side = [s for s in sockets if s[0][1] == port]
                upstream = [s for s in sockets if s[1][1] == engine_port]
                if client_side and upstream:
                    break
                await trio.sleep(0.1)
    assert client_side and upstream, (sockets, response.status_code, seen[:3])
    assert all(nodelay for _local, _peer, nodelay in client_side + upstream), sockets
    nursery.cancel_scope.cancel()

"""Round trips per second over llmgw.wire: gRPC between two processes (plaintext and mTLS) and the memory link.

    .venv/bin/python bench/wire_roundtrip.py [--seconds 3] [--window 1]

The control plane runs in a child process (this script with --serve) and echoes every Heartbeat with a
ControlMessage; the agent side (this process) sends one and waits for the answer (`--window 1`: latency-bound
ping-pong), or keeps `--window N` messages in flight. Printed: messages/s round trip per transport.
Reference: grpc.aio on trio-asyncio was measured at about 1.4k round trips/s on one core here before llmgw.wire, and at
690-770/s (one stream) on the loaded 2 cores just before grpc.aio moved to its own thread (issue 18): 370-450/s there
with a credit handed back per message, about 780/s with credits handed back 16 at a time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from llmgw.wire import (
    CertificateAuthority,
    ClientTls,
    agent_message,
    connect,
    control_message,
    join,
    memory_link_pair,
    pb,
    serve_agents,
)


async def echo(link, peer: str) -> None:  # type: ignore[no-untyped-def]
    async for message in link:
        await link.send(control_message(command_id=f"{message.heartbeat.time:g}"))


async def serve(ca_dir: str | None) -> None:
    tls = authority = None
    if ca_dir:
        authority = CertificateAuthority.load_or_create(ca_dir)
        tls = authority.server_tls(["127.0.0.1"])
    async with trio.open_nursery() as nursery:
        port = await nursery.start(
            lambda task_status: serve_agents(echo, "127.0.0.1", 0, tls=tls, join=authority, task_status=task_status)
        )
        print(f"{int(port)} {port.join_port or 0}", flush=True)


async def drive(link, seconds: float, window: int) -> float:  # type: ignore[no-untyped-def]
    """Round trips per second over `link` for `seconds`, with `window` messages in flight."""
    sent = received = 0
    heartbeat = agent_message(heartbeat=pb.Heartbeat(time=0))
    for _ in range(50):  # warm up
        await link.send(heartbeat)
        await link.receive()
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        while sent - received < window:
            await link.send(heartbeat)
            sent += 1
        await link.receive()
        received += 1
    elapsed = time.perf_counter() - start
    while received < sent:
        await link.receive()
        received += 1
    return received / elapsed


async def run_grpc(seconds: float, window: int, with_tls: bool) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, __file__, "--serve"] + (["--ca-dir", f"{tmp}/ca"] if with_tls else [])
        child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            port, join_port = map(int, child.stdout.readline().split())
            tls = None
            if with_tls:
                authority = CertificateAuthority.load_or_create(f"{tmp}/ca")  # same directory: shares its tokens
                ca_pem = authority.certificate_pem
                cert, key, _ = await join(f"127.0.0.1:{join_port}", authority.create_join_token(60), "bench", ca_pem)
                tls = ClientTls(ca_pem=ca_pem, certificate_pem=cert, key_pem=key)
            async with connect(f"127.0.0.1:{port}", tls=tls) as link:
                return await drive(link, seconds, window)
        finally:
            child.terminate()
            child.wait()


async def run_memory(seconds: float, window: int) -> float:
    agent_end, control_end = memory_link_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo, control_end, "memory")
        rate = await drive(agent_end, seconds, window)
        await agent_end.aclose()
    return rate


async def main(seconds: float, window: int) -> None:
    print(f"llmgw.wire round trips, window {window}, {seconds:g} s each (reference before: ~1.4k/s)")
    for name, rate in [
        ("grpc plaintext, 2 processes", await run_grpc(seconds, window, with_tls=False)),
        ("grpc mTLS, 2 processes", await run_grpc(seconds, window, with_tls=True)),
        ("memory link, 1 process", await run_memory(seconds, window)),
    ]:
        print(f"  {name:30s} {rate:10,.0f} messages/s round trip")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ca-dir", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve:
        try:
            trio.run(serve, options.ca_dir)
        except KeyboardInterrupt:
            pass
    else:
        trio.run(main, options.seconds, options.window)

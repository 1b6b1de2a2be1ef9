"""Inter-event gaps of a 1 ms-spaced stream, direct and through a gateway worker (issue 31 item 6).

    .venv/bin/python bench/event_gaps.py [--events 1000] [--gap-ms 1] [--rounds 3]

A mock engine (its own process, asyncio) answers a chat completion with `--events` content events, the i-th written
at start + i x `--gap-ms` (each in its own write, chunked transfer encoding), then the usage chunk and `[DONE]`.
The client (this process, a blocking socket in a thread, TCP_NODELAY irrelevant on the reading side) timestamps the
read that completes each event and reports the gaps between consecutive events (ms): p50, p99, max, the share of gaps
above 2 x `--gap-ms`, and the stream's length against the nominal events x gap. Targets, round after round: the
engine directly, then the gateway (one `llmgw.gateway.worker` process, SQLite store, an API key, no quota): what the
gateway adds to the spacing is the difference. With TCP_NODELAY off on either socket, Nagle's algorithm would hold a
small event until the previous one is acknowledged (up to the peer's delayed-ACK time, 40 ms on Linux): gaps of
0 ms and 40 ms instead of 1 ms. On a shared 2-core machine the figures are noisy; compare within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

CHUNK = (b'{"id":"chatcmpl-mock","object":"chat.completion.chunk","created":1700000000,"model":"mock",'
         b'"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}')
USAGE = b'{"id":"chatcmpl-mock","object":"chat.completion.chunk","created":1700000000,"model":"mock","choices":[],' \
        b'"usage":{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}}'


def _chunked(payload: bytes) -> bytes:
    event = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


def run_engine(events: int, gap: float) -> None:
    """The mock engine: serve on 127.0.0.1:0, print the port, answer every request with the spaced stream."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        loop = asyncio.get_running_loop()
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()
                return
            length = 0
            for line in head.lower().split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line[15:])
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            start = loop.time()
            for index in range(events):
                delay = start + index * gap - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(_chunked(CHUNK))
            writer.write(_chunked(USAGE % (events, events + 5)) + _chunked(b"[DONE]") + b"0\r\n\r\n")
            await writer.drain()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(main())


def stream_gaps(port: int, path: str, key: str | None) -> list[float]:
    """Send one streamed chat request; return the arrival times (perf_counter seconds) of its content events."""
    body = json.dumps({"model": "mock", "stream": True, "messages": [{"role": "user", "content": "Go."}]}).encode()
    auth = f"authorization: Bearer {key}\r\n".encode() if key else b""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                     + auth + b"content-length: %d\r\n\r\n" % len(body) + body)
        arrivals: list[float] = []
        seen = b""
        while True:
            data = sock.recv(65536)
            if not data:
                break
            now = time.perf_counter()
            seen = seen[-16:] + data
            arrivals.extend([now] * data.count(b'"content":"tok"'))
            if b"[DONE]" in seen:
                break
    return arrivals


def summary(arrivals: list[float], gap: float) -> str:
    gaps = sorted((b - a) * 1000 for a, b in zip(arrivals, arrivals[1:], strict=False))
    if not gaps:
        return "no events"
    p99 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))]
    late = sum(g > 2 * gap * 1000 for g in gaps) / len(gaps)
    span = (arrivals[-1] - arrivals[0]) * 1000
    return (f"events {len(arrivals):5d}  gap p50 {statistics.median(gaps):6.3f} ms  p99 {p99:6.3f} ms  "
            f"max {gaps[-1]:7.3f} ms  >2x gap {late:6.1%}  span {span:8.1f} ms (nominal {(len(gaps)) * gap * 1000:.0f})")


async def bench(events: int, gap: float, rounds: int) -> None:
    from llmgw.gateway import GatewayWorkers
    from llmgw.routes import ModelRoute, ProjectPolicy, ReplicaRoute, RouteTable
    from llmgw.store import open_store

    engine = subprocess.Popen([sys.executable, __file__, "--engine", "--events", str(events),
                               "--gap-ms", str(gap * 1000)], stdout=subprocess.PIPE, text=True)
    try:
        engine_port = int(engine.stdout.readline())
        with tempfile.TemporaryDirectory() as state:
            store = open_store(Path(state) / "store.db")
            _record, key = store.create_api_key("bench")
            table = RouteTable(models={"mock": ModelRoute("mock", replicas=(ReplicaRoute(
                "mock-1", "", f"http://127.0.0.1:{engine_port}", external=True),))},
                projects={"bench": ProjectPolicy("bench", "t", "o")})
            async with trio.open_nursery() as nursery:
                workers = GatewayWorkers(1, "127.0.0.1", 0, store_url=str(Path(state) / "store.db"),
                                         spool_root=Path(state) / "spools", metrics_dir=Path(state) / "metrics")
                port = await nursery.start(workers.serve)
                workers.set_table(table)
                await trio.sleep(0.5)  # the table reaches the worker
                for target, at, path, auth in (("direct", engine_port, "/v1/chat/completions", None),
                                               ("gateway", port, "/v1/chat/completions", key)):
                    await trio.to_thread.run_sync(stream_gaps, at, path, auth)  # warm-up
                for number in range(rounds):
                    for target, at, auth in (("direct", engine_port, None), ("gateway", port, key)):
                        arrivals = await trio.to_thread.run_sync(stream_gaps, at, "/v1/chat/completions", auth)
                        print(f"round {number + 1} {target:<8} {summary(arrivals, gap)}", flush=True)
                nursery.cancel_scope.cancel()
            store.close()
    finally:
        engine.kill()
        engine.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--gap-ms", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        run_engine(args.events, args.gap_ms / 1000)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    trio.run(bench, args.events, args.gap_ms / 1000, args.rounds)


if __name__ == "__main__":
    main()

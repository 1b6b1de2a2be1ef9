"""The gaps scenario of bench/gateway_overhead.py: many slow streams, as a busy GPU engine sends them (issue 11).

    .venv/bin/python bench/gateway_overhead.py --token-gap-ms 20 --streams 64,256 [--tokens 32] [--seconds 4]
        [--rounds 2] [--workers 2] [--no-naive]

A mock engine (asyncio protocol, one process) answers every chat completion with a server-sent event stream: a role
chunk at once, then `--tokens` content chunks `--token-gap-ms` apart (20 ms: 50 tokens/s per stream, what a GPU
engine under load gives each stream), a finish chunk, a usage-only chunk and `[DONE]`, chunked transfer encoding,
each event in its own write. The load generator (asyncio, raw HTTP/1.1, one keep-alive connection per stream) keeps
`--streams` streams open: each starts the next request as soon as its stream ended; starts are spread over the first
token gap times 10. Targets, each in its own process, measured round after round (interleaved):
- direct: the mock itself (its rate is the demand the others are held to);
- gateway: llmgw's gateway (SQLite store, an API key, a project with a requests-per-minute quota: every stream
  reserves and settles), `--workers` > 1 adds a row "gateway-wN" served by N worker processes (`GatewayWorkers`);
- gateway-base: with `--baseline-root DIR`, the gateway of another checkout (for example `git archive` of an older
  commit into DIR), for a before/after in one run;
- naive: hypercorn's trio worker and an httpx.AsyncClient relaying the engine's bytes untouched (no auth, no usage);
- litellm: only when its venv (~/.cache/llmgw/bench-litellm, see gateway_overhead.py) is already installed.

Cores: `os.sched_setaffinity` puts the mock and the load generator on core 0 and the server under test alone on the
other cores (core 1 on this 2-core machine). Other users of the machine still share both cores: figures are noisy,
so compare the ratios within one run.

Per target and stream count: content chunks relayed per second (events carrying a token, counted by the client over
the measuring window, after one second of ramp-up) against the demand (direct's rate; the nominal rate
streams x 1000 / gap_ms is printed too), the server process's CPU (user + system, /proc) per relayed chunk in µs,
and time to the first body byte (TTFB) p50/p99 in ms of the streams started inside the window.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHUNK = (b'{"id":"chatcmpl-mock","object":"chat.completion.chunk","created":1700000000,"model":"mock",'
         b'"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}')
ROLE = CHUNK.replace(b'{"content":"tok"}', b'{"role":"assistant","content":""}')
FINISH = CHUNK.replace(b'{"content":"tok"}', b"{}").replace(b'"finish_reason":null', b'"finish_reason":"length"')
TOKEN_MARK = b'{"content":"tok'  # what the client counts: one per content chunk, whatever the framing
STREAM_BODY = json.dumps({"model": "mock", "stream": True, "max_tokens": 32,
                          "messages": [{"role": "user", "content": "Count, please."}]}).encode()


def _chunked(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def _event(payload: bytes) -> bytes:
    return _chunked(b"data: " + payload + b"\n\n")


def split_requests(buffer: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The complete HTTP/1.1 requests at the start of `buffer` as (lower-cased head, body) pairs (bodies framed by
    content-length only: the load generators send nothing else), and the bytes left over."""
    requests = []
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            return requests, buffer
        head = buffer[:end].lower()
        length = 0
        at = head.find(b"content-length:")
        if at >= 0:
            length = int(head[at + 15:].split(b"\r\n", 1)[0])
        if len(buffer) < end + 4 + length:
            return requests, buffer
        requests.append((head, buffer[end + 4:end + 4 + length]))
        buffer = buffer[end + 4 + length:]


class RequestProtocol(asyncio.Protocol):
    """An asyncio protocol that calls `answer(head, body)` for each complete request (see split_requests)."""

    def connection_made(self, transport):
        self.transport = transport
        self.buffer = b""

    def data_received(self, data):
        self.buffer += data
        requests, self.buffer = split_requests(self.buffer)
        for head, body in requests:
            self.answer(head, body)

    def answer(self, head: bytes, body: bytes) -> None:
        raise NotImplementedError


# ---------------------------------------------------------------- mock SSE engine (subprocess: `mock-sse PORT GAP TOKENS`)
class _SseMock(RequestProtocol):
    gap = 0.02
    tokens = 32

    def answer(self, head: bytes, body: bytes) -> None:
        if head.startswith(b"get /health") or head.startswith(b"get /v1/models"):
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n"
                                 b"\r\n{\"status\":\"ok\"}")
            return
        tokens = self.tokens
        if b'"max_tokens":' in body:
            tokens = min(tokens, int(json.loads(body).get("max_tokens") or tokens))
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n" + _event(ROLE))
        asyncio.get_running_loop().call_later(self.gap, self._next, tokens, tokens)

    def _next(self, left: int, total: int) -> None:
        if self.transport.is_closing():
            return
        if left:
            self.transport.write(_event(CHUNK))
            asyncio.get_running_loop().call_later(self.gap, self._next, left - 1, total)
            return
        usage = (b'{"id":"chatcmpl-mock","object":"chat.completion.chunk","created":1700000000,"model":"mock",'
                 b'"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":%d,"total_tokens":%d}}'
                 % (total, total + 12))
        self.transport.write(_event(FINISH) + _event(usage) + _event(b"[DONE]") + b"0\r\n\r\n")


def start_baseline(root: str, port: int, mock_port: int, state: str) -> subprocess.Popen:
    """The gateway of another checkout at `root` (e.g. `git archive <commit>`) on `port` in front of the mock, its
    state in `<state>/base`: the `gateway-base` row of both scenarios."""
    Path(state, "base").mkdir()
    return subprocess.Popen([sys.executable, str(Path(root, "bench", "gateway_overhead.py")), "gateway", str(port),
                             str(mock_port), str(Path(state, "base"))], cwd=root, stderr=subprocess.DEVNULL)


def run_sse_mock(port: int, gap_ms: float, tokens: int) -> None:
    _SseMock.gap = gap_ms / 1000
    _SseMock.tokens = tokens

    async def main():
        server = await asyncio.get_running_loop().create_server(_SseMock, "127.0.0.1", port, backlog=4096)
        await server.serve_forever()
    asyncio.run(main())


# ---------------------------------------------------------------- naive relay (subprocess: `naive PORT MOCK_PORT`)
def run_naive(port: int, mock_port: int) -> None:
    """hypercorn-trio + httpx, bytes relayed as they come: what "a gateway" costs before it does anything."""
    import httpx
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve

    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{mock_port}", timeout=None,
                               limits=httpx.Limits(max_connections=None, max_keepalive_connections=1024))

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        async with client.stream("POST", scope["path"], content=body,
                                 headers={"content-type": "application/json"}) as response:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(b"content-type", response.headers["content-type"].encode())]})
            async for data in response.aiter_raw():
                await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.loglevel = "WARNING"
    config.keep_alive_max_requests = 1_000_000
    trio.run(serve, app, config)


# ---------------------------------------------------------------- load generator
class _Window:
    """The measuring window: counts content chunks and TTFBs between `start` and `end` (perf_counter seconds)."""

    def __init__(self, start: float, end: float):
        self.start, self.end = start, end
        self.chunks = 0
        self.ttfb: list[float] = []
        self.errors = 0
        self.streams = 0


async def _stream_client(port: int, key: str, window: _Window, delay: float) -> None:
    await asyncio.sleep(delay)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
               b"authorization: Bearer " + key.encode() + b"\r\ncontent-length: " + str(len(STREAM_BODY)).encode()
               + b"\r\n\r\n" + STREAM_BODY)
    try:
        while time.perf_counter() < window.end:
            began = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                window.errors += 1
                lower = head.lower()
                at = lower.find(b"content-length:")
                if at >= 0:
                    await reader.readexactly(int(lower[at + 15:].split(b"\r\n", 1)[0]))
                await asyncio.sleep(0.1)
                continue
            first = True
            tail = b""
            while True:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("the server closed the stream")
                now = time.perf_counter()
                if first:
                    first = False
                    if window.start <= began < window.end:
                        window.ttfb.append(now - began)
                        window.streams += 1
                if window.start <= now < window.end:
                    window.chunks += data.count(TOKEN_MARK)
                tail = (tail + data)[-16:]
                if tail.endswith(b"\r\n0\r\n\r\n"):
                    break
    except (ConnectionError, asyncio.IncompleteReadError):
        window.errors += 1
    finally:
        writer.close()


async def _measure_streams(port: int, key: str, streams: int, seconds: float, gap: float, pid: int) -> dict:
    began = time.perf_counter()
    ramp = 1.0 + gap * 10
    window = _Window(began + ramp, began + ramp + seconds)
    cpu: list[float] = []

    async def sample(at: float) -> None:
        await asyncio.sleep(at - time.perf_counter())
        cpu.append(_cpu_seconds(pid))

    await asyncio.gather(*(_stream_client(port, key, window, gap * 10 * i / streams) for i in range(streams)),
                         sample(window.start), sample(window.end))
    ttfb = sorted(window.ttfb)
    n = len(ttfb)
    return {"chunks_per_s": window.chunks / seconds, "cpu_us": (cpu[1] - cpu[0]) / max(1, window.chunks) * 1e6,
            "cpu_share": (cpu[1] - cpu[0]) / seconds, "errors": window.errors, "streams": window.streams,
            "ttfb_p50": ttfb[n // 2] * 1000 if n else float("nan"),
            "ttfb_p99": ttfb[min(n - 1, int(n * 0.99))] * 1000 if n else float("nan")}


def _cpu_seconds(pids) -> float:
    """User + system CPU seconds of the process `pids` (an int) or of every process in `pids` (a list)."""
    total = 0.0
    for pid in ([pids] if isinstance(pids, int) else pids):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _pin(pid: int, cores: set[int]) -> None:
    try:
        os.sched_setaffinity(pid, cores)
    except OSError:
        pass


def run(args, me: list[str], root: Path, free_port, wait_http, start_gateway, litellm_venv: Path) -> None:
    """The whole gaps scenario: start the targets, measure round after round, print the table and the ratios."""
    import tempfile

    cores = sorted(os.sched_getaffinity(0))
    load_core, server_cores = {cores[0]}, set(cores[1:]) or {cores[0]}
    _pin(0, load_core)
    levels = [int(s) for s in args.streams.split(",")]
    gap = args.token_gap_ms / 1000
    state = tempfile.mkdtemp(prefix="llmgw-bench-gaps-")
    mock_port = free_port()
    processes = [subprocess.Popen([*me, "mock-sse", str(mock_port), str(args.token_gap_ms), str(args.tokens)])]
    _pin(processes[0].pid, load_core)
    targets: list[tuple[str, int, object]] = [("direct", mock_port, processes[0].pid)]
    keys: dict[str, str] = {}
    try:
        wait_http(mock_port, "/health", 20)
        port = free_port()
        gateway = start_gateway(port, mock_port, state, 1)
        processes.append(gateway)
        targets.append(("gateway", port, gateway.pid))
        keys["gateway"] = state
        if args.baseline_root:  # the same gateway from another checkout (e.g. `git archive <commit>`), same run
            port = free_port()
            base = start_baseline(args.baseline_root, port, mock_port, state)
            processes.append(base)
            targets.append(("gateway-base", port, base.pid))
            keys["gateway-base"] = str(Path(state, "base"))
        if args.workers > 1:
            port = free_port()
            Path(state, "w").mkdir()
            many = start_gateway(port, mock_port, str(Path(state, "w")), args.workers)
            processes.append(many)
            targets.append((f"gateway-w{args.workers}", port, many))
            keys[f"gateway-w{args.workers}"] = str(Path(state, "w"))
        if not args.no_naive:
            port = free_port()
            naive = subprocess.Popen([*me, "naive", str(port), str(mock_port)], cwd=root)
            processes.append(naive)
            targets.append(("naive", port, naive.pid))
        litellm_note = ""
        if (litellm_venv / "bin" / "litellm").exists() and not args.no_litellm:
            from gateway_overhead import start_litellm
            port = free_port()
            lite = start_litellm(port, mock_port, state)
            processes.append(lite)
            wait_http(port, "/health/liveliness", 180)
            targets.append(("litellm", port, lite.pid))
        else:
            litellm_note = f"litellm: left out ({litellm_venv} is not installed; gateway_overhead.py installs it)"
        for name, port, _pid in targets[1:]:
            wait_http(port, "/health", 60)
        for _name, _port, proc in targets[1:]:
            for pid in _pid_list(proc):
                _pin(pid, server_cores)
        keys = {name: Path(where, "key").read_text() for name, where in keys.items()}
        for name, port, proc in targets:  # warm up
            asyncio.run(_measure_streams(port, keys.get(name, "none"), 8, 0.5, gap, _pids(proc)))
        results: dict[tuple[str, int], list[dict]] = {}
        for _round in range(args.rounds):
            for streams in levels:
                for name, port, proc in targets:
                    pids = _pids(proc)
                    for pid in _pid_list(proc):
                        _pin(pid, server_cores if name != "direct" else load_core)
                    results.setdefault((name, streams), []).append(
                        asyncio.run(_measure_streams(port, keys.get(name, "none"), streams, args.seconds, gap, pids)))
                    time.sleep(0.3)
        _print(results, levels, targets, args, litellm_note)
    finally:
        stop_all(processes)


def stop_all(processes: list[subprocess.Popen], seconds: float = 10) -> None:
    """Terminate `processes`, then kill those still running after `seconds`."""
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(seconds)
        except subprocess.TimeoutExpired:
            process.kill()


def _pids(proc) -> int | list[int]:
    """The pid to charge CPU to: the process itself, or (a gateway with workers) it and its children."""
    if isinstance(proc, int):
        return proc
    kids: list[int] = []
    for children in Path(f"/proc/{proc.pid}/task").glob("*/children"):  # every thread's: trio spawns from threads
        try:
            kids += [int(p) for p in children.read_text().split()]
        except OSError:
            pass
    return [proc.pid, *sorted(set(kids))]


def _pid_list(proc) -> list[int]:
    pids = _pids(proc)
    return [pids] if isinstance(pids, int) else pids


def _mean(rows: list[dict], field: str) -> float:
    return sum(r[field] for r in rows) / len(rows)


def _print_ratios(results, levels, other: str) -> None:
    head = f"gateway/{other}"
    print(f"\nstreams  {head} cpu per chunk   {head} chunks/s")
    for streams in levels:
        g, o = results["gateway", streams], results[other, streams]
        print(f"{streams:7d}  {_mean(g, 'cpu_us') / _mean(o, 'cpu_us'):{len(head) + 14}.2f}x"
              f"   {_mean(g, 'chunks_per_s') / _mean(o, 'chunks_per_s'):{len(head) + 8}.2f}x")


def _print(results, levels, targets, args, note: str) -> None:
    nominal = 1000 / args.token_gap_ms
    print(f"\ngaps scenario: {args.tokens} tokens per stream, {args.token_gap_ms:g} ms apart, {args.rounds} round(s) "
          f"of {args.seconds:g} s per cell (means); server under test pinned apart from mock + load generator")
    print(f"{'target':12} {'streams':>7} {'nominal/s':>9} {'chunks/s':>9} {'of direct':>9} {'cpu µs/chunk':>12} "
          f"{'cpu share':>9} {'TTFB p50 ms':>11} {'p99 ms':>8} {'errors':>6}")
    for streams in levels:
        direct = _mean(results["direct", streams], "chunks_per_s")
        for name, _port, _pid in targets:
            rows = results[name, streams]
            rate = _mean(rows, "chunks_per_s")
            print(f"{name:12} {streams:7d} {streams * nominal:9.0f} {rate:9.0f} {rate / direct:9.1%} "
                  f"{_mean(rows, 'cpu_us'):12.1f} {_mean(rows, 'cpu_share'):9.0%} {_mean(rows, 'ttfb_p50'):11.1f} "
                  f"{_mean(rows, 'ttfb_p99'):8.1f} {sum(r['errors'] for r in rows):6d}")
    names = {name for name, _p, _i in targets}
    for other in ("gateway-base", "naive"):
        if other in names:
            _print_ratios(results, levels, other)
    if note:
        print(note)

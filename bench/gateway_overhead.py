"""What the gateway adds: latency p50/p99 and requests/s through llmgw, directly, and through LiteLLM's proxy.

    .venv/bin/python bench/gateway_overhead.py [--seconds 3] [--concurrency 1,16,64] [--no-litellm]
        [--postgres URL | --no-postgres]
    .venv/bin/python bench/gateway_overhead.py --token-gap-ms 20 --streams 64,256   (the gaps scenario: streams,
        chunks relayed per second, CPU per chunk, TTFB; bench/gateway_gaps.py says how)

One run starts, each in its own process: a fast mock engine (asyncio, fixed chat-completion answer with usage) on
loopback; the llmgw gateway in front of it (SQLite store in a temporary directory, an API key, a project with a
requests-per-minute quota so that every request reserves and settles in the store, usage recorded); and LiteLLM's
proxy in front of the same mock (installed by this script into its own virtual environment under
~/.cache/llmgw/bench-litellm, one worker, no database, LITELLM_LOCAL_MODEL_COST_MAP=True, warmed up first).
The load generator is a raw keep-alive HTTP/1.1 client (asyncio), one connection per concurrent client, so its
own cost stays small. For each target and concurrency: p50/p99 latency, requests/s, the server's CPU per request
(from /proc, gateway or LiteLLM process only), then the gateway's added p50/p99 over direct and its throughput
ratio over LiteLLM. Targets (issue 5): added p50 <= 1 ms; >= 3x LiteLLM's requests/s (issue 11: >= 10x, and at
most 0.8 ms of gateway CPU per request). `--baseline-root DIR` adds the gateway of another checkout ("gateway-base",
e.g. `git archive` of an older commit, SQLite store of its own) to the same run, interleaved with the others, and
prints its added p50 and CPU per request beside this checkout's.

The same gateway also runs a second time, its store on PostgreSQL ("gateway-pg": a schema of its own in the
database of --postgres, default postgresql://127.0.0.1:5432/test, dropped at the end; usage spool in the temporary
directory), in the same run: its CPU per request beside the SQLite gateway's (target, issue 10: at most 1.3x),
and the CPU the PostgreSQL server processes spent per request (every `postgres` process on this machine, so other
users of the database count too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gateway_gaps import RequestProtocol, start_baseline, stop_all

ROOT = Path(__file__).resolve().parents[1]
LITELLM_VERSION = "1.108.7"
LITELLM_VENV = Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw") / "bench-litellm"
ANSWER = json.dumps({
    "id": "chatcmpl-mock", "object": "chat.completion", "created": 1700000000, "model": "mock",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok " * 8}}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20},
}).encode()
BODY = json.dumps({"model": "mock", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "Say ok eight times, please."}]}).encode()


# ---------------------------------------------------------------- mock engine (subprocess: `mock PORT`)
class _MockProtocol(RequestProtocol):
    def answer(self, head: bytes, body: bytes) -> None:
        answer = b'{"status":"ok"}' if head.startswith(b"get /health") else ANSWER
        self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(answer)).encode() + b"\r\n\r\n" + answer)


def run_mock(port: int) -> None:
    async def main():
        server = await asyncio.get_running_loop().create_server(_MockProtocol, "127.0.0.1", port, backlog=1024)
        await server.serve_forever()
    asyncio.run(main())


# ---------------------------------------------------------------- gateway (subprocess: `gateway PORT MOCK_PORT DIR [STORE]`)
def run_gateway(port: int, mock_port: int, state_dir: str, store_url: str | None = None, workers: int = 1) -> None:
    import trio

    from llmgw.gateway import Gateway, GatewayWorkers
    from llmgw.routes import ModelRoute, ProjectPolicy, Quota, ReplicaRoute, RouteTable
    from llmgw.store import open_store

    Path(state_dir).mkdir(parents=True, exist_ok=True)
    store = open_store(store_url or Path(state_dir) / "store.db")
    _record, plaintext = store.create_api_key("bench")
    Path(state_dir, "key" if store_url is None else "key-pg").write_text(plaintext)
    table = RouteTable(
        models={"mock": ModelRoute("mock", replicas=(ReplicaRoute("mock-1", "local", f"http://127.0.0.1:{mock_port}",
                                                                  replica_key="engine-key"),))},
        projects={"bench": ProjectPolicy("bench", "team", "org",
                                         quotas=(("project:bench", Quota(requests_per_minute=10**9)),))})
    if workers > 1:  # worker processes, fed this table, as `listeners.gateway.workers: N` runs them
        many = GatewayWorkers(workers, "127.0.0.1", port, store_url=store_url or str(Path(state_dir) / "store.db"),
                              spool_root=Path(state_dir) / "spools", metrics_dir=Path(state_dir) / "metrics")
        many.set_table(table)
        trio.run(many.serve)
        return
    slowed = {}
    if os.environ.get("LLMGW_BENCH_UNDER_VALGRIND"):  # 50x slower: no settle may miss its wait, no key re-checked
        slowed = {"settle_wait": 600.0, "key_cache_seconds": 3600.0}
    gateway = Gateway(store, table, spool_dir=Path(state_dir) / ("spool" if store_url is None else "spool-pg"),
                      **slowed)
    profile_to = os.environ.get("LLMGW_BENCH_CPROFILE")  # a path: the gateway's cProfile stats, written on SIGTERM
    if not profile_to:
        trio.run(gateway.serve, "127.0.0.1", port)
        return
    import cProfile
    import signal

    profiler = cProfile.Profile()

    def stop(*_args):
        profiler.disable()
        profiler.dump_stats(profile_to)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    profiler.enable()
    trio.run(gateway.serve, "127.0.0.1", port)


# ---------------------------------------------------------------- LiteLLM
def ensure_litellm() -> Path:
    """The `litellm` command of our own venv, installed on first use (pip, PyPI)."""
    binary = LITELLM_VENV / "bin" / "litellm"
    if binary.exists():
        return binary
    print(f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV} (once) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
    subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q", f"litellm[proxy]=={LITELLM_VERSION}"],
                   check=True)
    return binary


def start_litellm(port: int, mock_port: int, state_dir: str) -> subprocess.Popen:
    config = Path(state_dir) / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: mock\n"
        "    litellm_params:\n"
        "      model: openai/mock\n"
        f"      api_base: http://127.0.0.1:{mock_port}/v1\n"
        "      api_key: engine-key\n"
        "general_settings:\n"
        "  dangerously_permit_weak_or_unset_master_key: true\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  set_verbose: false\n")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
           "LITELLM_TELEMETRY": "False", "DISABLE_SCHEMA_UPDATE": "True"}
    return subprocess.Popen([str(ensure_litellm()), "--config", str(config), "--host", "127.0.0.1", "--port",
                             str(port), "--num_workers", "1"], env=env, stdout=subprocess.DEVNULL,
                            stderr=open(Path(state_dir) / "litellm.log", "wb"))


# ---------------------------------------------------------------- load generator
async def _client(port: int, path: bytes, key: str, deadline: float, latencies: list[float], errors: list[int],
                  body: bytes = BODY):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (b"POST " + path + b" HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
               b"authorization: Bearer " + key.encode() + b"\r\ncontent-length: " + str(len(body)).encode()
               + b"\r\n\r\n" + body)
    try:
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            writer.write(request)
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):  # the server closed a kept-alive connection
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                continue
            lower = head.lower()
            status = int(head.split(b" ", 2)[1])
            at = lower.find(b"content-length:")
            if at >= 0:
                await reader.readexactly(int(lower[at + 15:].split(b"\r\n", 1)[0]))
            else:  # chunked
                while True:
                    size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                    await reader.readexactly(size + 2)
                    if size == 0:
                        break
            latencies.append(time.perf_counter() - began)
            if status != 200:
                errors.append(status)
    finally:
        writer.close()


async def _measure(port: int, path: bytes, key: str, concurrency: int, seconds: float, body: bytes = BODY):
    latencies: list[float] = []
    errors: list[int] = []
    deadline = time.perf_counter() + seconds
    began = time.perf_counter()
    await asyncio.gather(*(_client(port, path, key, deadline, latencies, errors, body) for _ in range(concurrency)))
    return latencies, errors, time.perf_counter() - began


def measure(port, path, key, concurrency, seconds, pid, body: bytes = BODY):
    """Latency p50/p99 (ms), requests/s, errors and the server `pid`'s CPU ms per request of `concurrency` keep-alive
    clients POSTing `body` to `path` for `seconds`."""
    cpu0 = _cpu_seconds(pid)
    latencies, errors, elapsed = asyncio.run(_measure(port, path, key, concurrency, seconds, body))
    cpu = _cpu_seconds(pid) - cpu0
    latencies.sort()
    n = len(latencies)
    return {"n": n, "errors": len(errors), "rps": n / elapsed, "p50": latencies[n // 2] * 1000,
            "p99": latencies[min(n - 1, int(n * 0.99))] * 1000, "cpu_ms": cpu / max(1, n) * 1000}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _postgres_cpu_seconds() -> float:
    """CPU seconds (user + system) of every process named `postgres` on this machine, now."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if stat.split("(", 1)[1].split(")", 1)[0] == "postgres":
                fields = stat.rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _postgres_schema(url: str, drop: str | None = None) -> str:
    """Create a fresh schema in `url`'s database and return the URL that uses it; or drop the schema `drop`."""
    import secrets

    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        if drop is not None:
            conn.execute(f"DROP SCHEMA IF EXISTS {drop} CASCADE")
            return drop
        name = "llmgw_bench_" + secrets.token_hex(4)
        conn.execute(f"CREATE SCHEMA {name}")
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{name}"


def _key(state: str, target: str) -> str:
    """The API key for `target` (each gateway has its own store)."""
    if target == "gateway-base":
        return Path(state, "base", "key").read_text()
    return Path(state, "key-pg" if target == "gateway-pg" else "key").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(port: int, path: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
                if s.recv(100).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"nothing answered on port {port}{path} within {seconds:.0f} s")


def _start_gateway(port: int, mock_port: int, state_dir: str, workers: int = 1) -> subprocess.Popen:
    """A gateway process in front of the mock (`workers` > 1: that many worker processes under it)."""
    return subprocess.Popen([sys.executable, __file__, "gateway", str(port), str(mock_port), state_dir,
                             "", str(workers)], cwd=ROOT, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per cell")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--postgres", default=os.environ.get("LLMGW_BENCH_POSTGRES", "postgresql://127.0.0.1:5432/test"),
                        help="database for the gateway-pg row (a schema is created and dropped)")
    parser.add_argument("--no-postgres", action="store_true", help="leave out the gateway-pg row")
    parser.add_argument("--token-gap-ms", type=float, default=None,
                        help="the gaps scenario (streams whose tokens come this far apart; see bench/gateway_gaps.py)")
    parser.add_argument("--streams", default="64,256", help="gaps scenario: concurrent streams per cell")
    parser.add_argument("--tokens", type=int, default=32, help="gaps scenario: content chunks per stream")
    parser.add_argument("--rounds", type=int, default=2, help="gaps scenario: interleaved rounds per cell")
    parser.add_argument("--workers", type=int, default=1, help="gaps scenario: also a gateway with N workers")
    parser.add_argument("--no-naive", action="store_true", help="gaps scenario: leave out the naive relay")
    parser.add_argument("--baseline-root", default=None,
                        help="also the gateway of this checkout (gateway-base: a before/after in one run)")
    args = parser.parse_args()
    if args.token_gap_ms is not None:
        import gateway_gaps

        if args.seconds == 3.0:
            args.seconds = 4.0
        gateway_gaps.run(args, [sys.executable, __file__], ROOT, _free_port, _wait_http, _start_gateway, LITELLM_VENV)
        return
    levels = [int(c) for c in args.concurrency.split(",")]
    state = tempfile.mkdtemp(prefix="llmgw-bench-")
    me = [sys.executable, __file__]
    mock_port, gateway_port, litellm_port = _free_port(), _free_port(), _free_port()
    processes = [subprocess.Popen([*me, "mock", str(mock_port)])]
    processes.append(subprocess.Popen([*me, "gateway", str(gateway_port), str(mock_port), state],
                                      cwd=ROOT, stderr=subprocess.DEVNULL))
    pg_url = None if args.no_postgres else _postgres_schema(args.postgres)
    pg_port = _free_port()
    if pg_url is not None:
        processes.append(subprocess.Popen([*me, "gateway", str(pg_port), str(mock_port), state, pg_url], cwd=ROOT,
                                          stderr=subprocess.DEVNULL))
    try:
        _wait_http(mock_port, "/health", 20)
        _wait_http(gateway_port, "/health", 30)
        targets = [("direct", mock_port, processes[0].pid), ("gateway", gateway_port, processes[1].pid)]
        if pg_url is not None:
            _wait_http(pg_port, "/health", 30)
            targets.append(("gateway-pg", pg_port, processes[2].pid))
        if args.baseline_root:  # the same gateway from another checkout (e.g. `git archive <commit>`), same run
            base_port = _free_port()
            base = start_baseline(args.baseline_root, base_port, mock_port, state)
            processes.append(base)
            _wait_http(base_port, "/health", 30)
            targets.append(("gateway-base", base_port, base.pid))
        if not args.no_litellm:
            litellm = start_litellm(litellm_port, mock_port, state)
            processes.append(litellm)
            _wait_http(litellm_port, "/health/liveliness", 180)
            targets.append(("litellm", litellm_port, litellm.pid))
        for name, port, pid in targets:  # warm up (LiteLLM imports lazily)
            measure(port, b"/v1/chat/completions", _key(state, name), 4, 5.0 if name == "litellm" else 1.0, pid)
        results: dict[tuple[str, int], dict] = {}
        for concurrency in levels:
            for name, port, pid in targets:
                pg_cpu = _postgres_cpu_seconds()
                results[name, concurrency] = measure(port, b"/v1/chat/completions", _key(state, name), concurrency,
                                                     args.seconds, pid)
                results[name, concurrency]["pg_cpu_ms"] = ((_postgres_cpu_seconds() - pg_cpu)
                                                           / max(1, results[name, concurrency]["n"]) * 1000)
                time.sleep(1.0 if name == "litellm" else 0.2)  # let LiteLLM's background work settle
        print(f"\n{'target':8} {'conc':>4} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'cpu ms/req':>10} {'errors':>6}")
        for concurrency in levels:
            for name, _port, _pid in targets:
                r = results[name, concurrency]
                print(f"{name:8} {concurrency:4d} {r['rps']:8.0f} {r['p50']:8.2f} {r['p99']:8.2f} "
                      f"{r['cpu_ms']:10.2f} {r['errors']:6d}")
        if args.baseline_root:
            print("\nconc  added p50 ms gateway / gateway-base   cpu ms/req gateway / gateway-base   req/s ratio")
            for concurrency in levels:
                g, b, d = (results[name, concurrency] for name in ("gateway", "gateway-base", "direct"))
                print(f"{concurrency:4d}  {g['p50'] - d['p50']:8.2f} / {b['p50'] - d['p50']:5.2f}"
                      f"   {g['cpu_ms']:14.2f} / {b['cpu_ms']:5.2f} = {g['cpu_ms'] / b['cpu_ms']:4.2f}x"
                      f"   {g['rps'] / b['rps']:11.2f}")
        print("\nconc  gateway added p50/p99 ms   gateway/direct req/s   gateway/litellm req/s   litellm added p50 ms")
        for concurrency in levels:
            g, d = results["gateway", concurrency], results["direct", concurrency]
            line = (f"{concurrency:4d}  {g['p50'] - d['p50']:8.2f} / {g['p99'] - d['p99']:8.2f}"
                    f"   {g['rps'] / d['rps']:20.2f}")
            if ("litellm", concurrency) in results:
                lite = results["litellm", concurrency]
                line += f"   {g['rps'] / lite['rps']:21.2f}   {lite['p50'] - d['p50']:18.2f}"
            print(line)
        if pg_url is not None:
            print("\nconc  cpu ms/req gateway-pg / gateway   postgres server cpu ms/req (gateway-pg / gateway)   "
                  "gateway-pg added p50 ms")
            for concurrency in levels:
                g, pg, d = results["gateway", concurrency], results["gateway-pg", concurrency], results["direct", concurrency]
                print(f"{concurrency:4d}  {pg['cpu_ms']:6.2f} / {g['cpu_ms']:6.2f} = {pg['cpu_ms'] / g['cpu_ms']:4.2f}x"
                      f"   {pg['pg_cpu_ms']:24.2f} / {g['pg_cpu_ms']:6.2f}"
                      f"   {pg['p50'] - d['p50']:26.2f}")
    finally:
        stop_all(processes)
        if pg_url is not None:
            _postgres_schema(args.postgres, drop=pg_url.rsplit("%3D", 1)[1])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "mock":
        run_mock(int(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "gateway":
        sys.path.insert(0, str(ROOT))
        run_gateway(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], (sys.argv[5] or None) if len(sys.argv) > 5 else None,
                    int(sys.argv[6]) if len(sys.argv) > 6 else 1)
    elif len(sys.argv) > 1 and sys.argv[1] == "mock-sse":
        import gateway_gaps
        gateway_gaps.run_sse_mock(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "naive":
        import gateway_gaps
        gateway_gaps.run_naive(int(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "install-litellm":
        print(ensure_litellm())
    else:
        main()

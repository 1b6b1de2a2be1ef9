"""Instructions the gateway executes per metered request, its store on SQLite and on PostgreSQL (callgrind, issue 10).

    .venv/bin/python bench/gateway_store_instructions.py [--requests 400] [--concurrency 1,16,64] [--postgres URL]
        [--only sqlite|postgresql]

bench/gateway_overhead.py's PostgreSQL row (gateway CPU per request, PostgreSQL against SQLite, target <= 1.3x) moves
by tens of percent between runs on a shared 2-core machine; instruction counts do not. Both gateways (as
gateway_overhead.py starts them: an API key, a project with a requests-per-minute quota, so that every request
reserves and settles in the store; the PostgreSQL one in a schema of its own, dropped at the end) run under
`valgrind --tool=callgrind` in front of its mock engine. Under valgrind a gateway runs about 50 times slower, so
`LLMGW_BENCH_UNDER_VALGRIND` gives it a settle wait of 600 s and a key cache of an hour: every settlement is
written while its request waits (none goes the spool's fsync path), and the key is checked once, as at full speed.

For each concurrency: the counters are zeroed (`callgrind_control --zero`), `--requests` chat completions are sent
by that many keep-alive clients, and the counters dumped. Printed: user-space instructions (Ir) per request for each
store, and their ratio; answers other than 200 are counted and named (under valgrind, at concurrency 64, a few
requests may time out). Every thread of the gateway counts (the store's worker threads too); the kernel (socket
syscalls, futexes) and the postgres server do not. `LLMGW_BENCH_ANNOTATE=1` also prints the top functions of each
dump (`callgrind_annotate --inclusive=yes`). About 2 minutes per 1,000 requests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_gaps import stop_all  # noqa: E402
from gateway_overhead import BODY, ROOT, _free_port, _postgres_schema, _wait_http  # noqa: E402


async def _requests(port: int, key: str, concurrency: int, requests: int) -> list[int]:
    """Send `requests` chat completions over `concurrency` keep-alive connections; returns the statuses other
    than 200."""
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
               b"authorization: Bearer " + key.encode() + b"\r\ncontent-length: " + str(len(BODY)).encode()
               + b"\r\n\r\n" + BODY)

    async def client(count: int) -> list[int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        failed = []
        for _ in range(count):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            lower = head.lower()
            at = lower.find(b"content-length:")
            await reader.readexactly(int(lower[at + 15:].split(b"\r\n", 1)[0]))
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                failed.append(status)
        writer.close()
        return failed

    shares = [requests // concurrency + (i < requests % concurrency) for i in range(concurrency)]
    return [status for failed in await asyncio.gather(*(client(n) for n in shares if n)) for status in failed]


def _total_ir(dump: Path) -> int:
    """The PROGRAM TOTALS of a callgrind dump."""
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {dump}")


def measure(name: str, store_url: str | None, mock_port: int, state: str, levels: list[int],
            requests: int) -> dict[int, float]:
    """Ir per request of one gateway (store at `store_url`, None: SQLite) at each concurrency of `levels`."""
    port = _free_port()
    out = Path(state, f"callgrind-{name}")
    out.mkdir()
    env = {**os.environ, "LLMGW_BENCH_UNDER_VALGRIND": "1"}
    gateway = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/callgrind.out", "-q",
                                sys.executable, str(Path(__file__).with_name("gateway_overhead.py")), "gateway",
                                str(port), str(mock_port), state, store_url or ""],
                               cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    try:
        _wait_http(port, "/health", 600)
        key = Path(state, "key" if store_url is None else "key-pg").read_text()
        asyncio.run(_requests(port, key, 4, 40))  # first-use costs (imports, connections, threads) before counting
        results = {}
        for concurrency in levels:
            subprocess.run(["callgrind_control", "--zero", str(gateway.pid)], check=True, capture_output=True)
            failed = asyncio.run(_requests(port, key, concurrency, requests))
            subprocess.run(["callgrind_control", "--dump", str(gateway.pid)], check=True, capture_output=True)
            dump = max(out.glob("callgrind.out*"), key=os.path.getmtime)
            results[concurrency] = _total_ir(dump) / requests
            print(f"{name:10} conc {concurrency:3d}: {results[concurrency]:12,.0f} Ir/request"
                  + (f"   ({len(failed)} not 200: {sorted(set(failed))})" if failed else ""), flush=True)
            if os.environ.get("LLMGW_BENCH_ANNOTATE"):
                annotate = subprocess.run(["callgrind_annotate", "--inclusive=yes", str(dump)], capture_output=True,
                                          text=True).stdout
                print("\n".join(annotate.splitlines()[:70]))
        return results
    finally:
        stop_all([gateway], 20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per concurrency level")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--postgres", default=os.environ.get("LLMGW_BENCH_POSTGRES", "postgresql://127.0.0.1:5432/test"))
    parser.add_argument("--only", choices=("sqlite", "postgresql"), default=None)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    state = tempfile.mkdtemp(prefix="llmgw-bench-store-ir-")
    mock_port = _free_port()
    mock = subprocess.Popen([sys.executable, str(Path(__file__).with_name("gateway_overhead.py")), "mock",
                             str(mock_port)])
    pg_url = None
    try:
        _wait_http(mock_port, "/health", 20)
        results = {}
        if args.only != "postgresql":
            results["sqlite"] = measure("sqlite", None, mock_port, state, levels, args.requests)
        if args.only != "sqlite":
            pg_url = _postgres_schema(args.postgres)
            results["postgresql"] = measure("postgresql", pg_url, mock_port, state, levels, args.requests)
        if len(results) == 2:
            print("\nconc   Ir/request PostgreSQL / SQLite")
            for concurrency in levels:
                pg, lite = results["postgresql"][concurrency], results["sqlite"][concurrency]
                print(f"{concurrency:4d}   {pg:12,.0f} / {lite:12,.0f} = {pg / lite:4.2f}x")
    finally:
        stop_all([mock])
        if pg_url is not None:
            _postgres_schema(args.postgres, drop=pg_url.rsplit("%3D", 1)[1])


if __name__ == "__main__":
    main()

"""Reserve + settle through the store, SQLite against PostgreSQL, in one process: CPU and time per request.

    .venv/bin/python bench/store_reserve_settle.py [--requests 2000] [--postgres URL]

Each request reserves against a project with requests-per-minute, tokens-per-minute and concurrency limits, then
applies its settlement (closes the reservation, records the usage, one transaction: what the gateway's spool
writes). One thread, one request at a time. Printed per backend: wall time per request (mean, p99), this process's
CPU per request, and for PostgreSQL the CPU of every `postgres` process on the machine per request (other users of
the database count too). The SQLite file and the PostgreSQL schema are temporary (the schema is dropped).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmgw.routes import Quota  # noqa: E402
from llmgw.store import Settlement, UsageRecord, charged, open_store  # noqa: E402

SCOPES = [("project:bench", Quota(requests_per_minute=10**9, tokens_per_minute=10**12, concurrent_requests=64)),
          ("team:bench", Quota())]


def postgres_cpu_seconds() -> float:
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


def run(store, requests: int) -> dict:
    def one() -> float:
        began = time.perf_counter()
        reservation = store.reserve(SCOPES, 40, 0.0)
        now = time.time()
        store.apply_settlement(Settlement(
            entry_id="stl_" + uuid.uuid4().hex, time=now, reservation_id=reservation.reservation_id,
            has_slots=bool(reservation.slots), actual_tokens=20, charges=charged(reservation), usage=UsageRecord("bench", "mock", now,
                                                                                   prompt_tokens=12,
                                                                                   completion_tokens=8)))
        return time.perf_counter() - began

    for _ in range(min(200, requests)):  # warm up: prepared statements, pages in cache
        one()
    pg0, cpu0 = postgres_cpu_seconds(), time.process_time()
    walls = sorted(one() for _ in range(requests))
    cpu, pg = time.process_time() - cpu0, postgres_cpu_seconds() - pg0
    return {"mean_ms": sum(walls) / requests * 1000, "p99_ms": walls[int(requests * 0.99)] * 1000,
            "cpu_us": cpu / requests * 1e6, "pg_cpu_us": pg / requests * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--postgres", default=os.environ.get("LLMGW_BENCH_POSTGRES", "postgresql://127.0.0.1:5432/test"))
    args = parser.parse_args()
    import psycopg

    schema = "llmgw_bench_" + secrets.token_hex(4)
    with psycopg.connect(args.postgres, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    results = {}
    try:
        with tempfile.TemporaryDirectory() as state:
            for name, url in (("sqlite", str(Path(state) / "llmgw.sqlite3")),
                              ("postgresql", f"{args.postgres}{'&' if '?' in args.postgres else '?'}"
                                             f"options=-csearch_path%3D{schema}")):
                store = open_store(url)
                try:
                    results[name] = run(store, args.requests)
                finally:
                    store.close()
    finally:
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    print(f"{'backend':10} {'requests':>8} {'mean ms':>8} {'p99 ms':>8} {'cpu us/req':>10} {'postgres cpu us/req':>20}")
    for name, r in results.items():
        print(f"{name:10} {args.requests:8d} {r['mean_ms']:8.3f} {r['p99_ms']:8.3f} {r['cpu_us']:10.0f} "
              f"{r['pg_cpu_us'] if name == 'postgresql' else 0:20.0f}")
    print(f"\npostgresql / sqlite, this process's CPU per request: "
          f"{results['postgresql']['cpu_us'] / results['sqlite']['cpu_us']:.2f}x")


if __name__ == "__main__":
    main()

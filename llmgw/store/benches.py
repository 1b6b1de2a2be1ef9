"""Results of `llmgw bench`: one row per run against one replica (table `bench_results`, SQLite migration 9,
PostgreSQL 7), kept so `llmgw nodes` can show what each replica was measured to do.

A row names what was measured (the replica id, its model, the node it ran on, the node class: "2x H200",
"cpu 16 cores", and the engine build the engine itself reported: llama-server's `system_fingerprint` "b11434"),
how (`via` "engine" through the replica key, or "gateway"; prompt and output tokens asked per request; concurrency;
requests), when (epoch seconds), the headline figures as columns (TTFT p50 and p90 in seconds, inter-token latency
p50 in seconds, output tokens per second over the whole run) and `summary`: the whole summary as JSON
(`llmgw.control.bench_stats.BenchSummary.to_json`). Functions taking a connection run inside the caller's
transaction. Nothing here deletes a row: a new bench of a replica is a new row, the latest one wins on display.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from llmgw.store.dialects import SqlConnection

COLUMNS = ("id", "time", "replica", "model", "node", "node_class", "engine_build", "via", "prompt_tokens",
           "output_tokens", "concurrency", "requests", "ttft_p50_seconds", "ttft_p90_seconds", "itl_p50_seconds",
           "output_tokens_per_second", "summary")


@dataclass(frozen=True)
class BenchRecord:
    """One bench run of one replica. Times in epoch seconds; latencies in seconds (None: no request measured one);
    `output_tokens_per_second`: completion tokens of every request over the run's wall time. `id` is 0 until
    stored. `summary`: the whole summary as a JSON-ready dict."""

    time: float
    replica: str
    model: str
    node: str
    node_class: str
    engine_build: str
    via: str
    prompt_tokens: int
    output_tokens: int
    concurrency: int
    requests: int
    ttft_p50_seconds: float | None
    ttft_p90_seconds: float | None
    itl_p50_seconds: float | None
    output_tokens_per_second: float
    summary: dict[str, Any] = field(default_factory=dict)
    id: int = 0


def insert(conn: SqlConnection, record: BenchRecord) -> int:
    """Write `record` (its `id` ignored); returns the new row's id."""
    names = COLUMNS[1:]
    values = tuple(getattr(record, name) for name in names[:-1]) + (json.dumps(record.summary, sort_keys=True),)
    row = conn.execute(f"INSERT INTO bench_results ({', '.join(names)}) VALUES ({', '.join('?' * len(names))}) "
                       "RETURNING id", values).fetchone()
    return int(row[0])


def latest(conn: SqlConnection, replica: str | None = None, limit: int = 100) -> list[BenchRecord]:
    """The latest `limit` rows (of `replica` when given), newest first."""
    where, params = ("WHERE replica = ? ", (replica,)) if replica is not None else ("", ())
    rows = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM bench_results {where}ORDER BY time DESC, id DESC "
                        "LIMIT ?", (*params, limit)).fetchall()
    return [_record(row) for row in rows]


def _record(row: tuple) -> BenchRecord:
    values = dict(zip(COLUMNS, row))
    return BenchRecord(
        time=float(values["time"]), replica=values["replica"], model=values["model"], node=values["node"],
        node_class=values["node_class"], engine_build=values["engine_build"], via=values["via"],
        prompt_tokens=int(values["prompt_tokens"]), output_tokens=int(values["output_tokens"]),
        concurrency=int(values["concurrency"]), requests=int(values["requests"]),
        ttft_p50_seconds=_float(values["ttft_p50_seconds"]), ttft_p90_seconds=_float(values["ttft_p90_seconds"]),
        itl_p50_seconds=_float(values["itl_p50_seconds"]),
        output_tokens_per_second=float(values["output_tokens_per_second"]),
        summary=json.loads(values["summary"]), id=int(values["id"]))


def _float(value: Any) -> float | None:
    return None if value is None else float(value)

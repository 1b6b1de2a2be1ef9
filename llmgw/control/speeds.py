"""Each replica's measured speed, from the results of `llmgw bench` kept in the store (pure: records in, speeds out).

The "expected-time" routing policy (`llmgw.gateway.routing_expected`) reads a `ReplicaSpeed` per replica: prefill
and decode tokens per second of the whole replica. A bench run through the replica's engine (`via` "engine";
runs through the gateway measure no one replica and are left out) gives them as:

- decode: the run's median decode tokens/s per request times its concurrency (what the replica makes with that
  many requests at once; at concurrency 1, one request's speed);
- prefill: the prompt tokens asked per request over the run's median TTFT (the prompt's processing, queueing
  included), times its concurrency likewise;
- slots: the requests the engine runs at once, as llama-server's `/props` told the bench (`engine_slots` in the
  summary; 0, unknown, for vLLM and runs without it).

The latest run of each replica wins, whatever its age (`measured_at` keeps it). A run without the figures (every
request failed, or one token each) gives no speed.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.routes import ReplicaSpeed
from llmgw.store import BenchRecord

SOURCE = "bench"


def speed_of_bench(record: BenchRecord) -> ReplicaSpeed | None:
    """The speed one bench run measured (see the module docstring); None when it has no TTFT or decode figure."""
    decode = ((record.summary.get("decode_tokens_per_second") or {}).get("p50"))
    ttft = record.ttft_p50_seconds
    if not decode or not ttft or ttft <= 0 or record.via != "engine":
        return None
    return ReplicaSpeed(prefill_tokens_per_second=record.prompt_tokens / ttft * record.concurrency,
                        decode_tokens_per_second=float(decode) * record.concurrency,
                        slots=int(record.summary.get("engine_slots") or 0),
                        measured_at=record.time, source=SOURCE)


def speeds_from_benches(records: Iterable[BenchRecord]) -> dict[str, ReplicaSpeed]:
    """Replica id -> the speed of its latest bench run that has one (`records` in any order)."""
    latest: dict[str, BenchRecord] = {}
    for record in records:
        if speed_of_bench(record) is None:
            continue
        kept = latest.get(record.replica)
        if kept is None or (record.time, record.id) > (kept.time, kept.id):
            latest[record.replica] = record
    return {replica: speed for replica, record in sorted(latest.items())
            if (speed := speed_of_bench(record)) is not None}

"""Each replica's measured speed, from the results of `llmgw bench` kept in the store and from its engine's own
counters (`llmgw.control.engine_speeds`), merged into what routing uses (pure: records in, speeds out).

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

Merged with the engines' counters (`merged_speeds`): per replica, the newer of its bench speed and its metrics speed
wins (the metrics one's time is the older of its prefill and decode figures'; a tie goes to the bench), and a
metrics speed keeps the bench's `slots` (the counters do not say how many requests the engine runs at once). A
replica with several shards takes the speed of the shard measured last. The gateway gets a new table only when a
replica's figures moved by more than `ROUTING_TOLERANCE` (`routing_changed`), not on every reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from llmgw.control.registry import NodeRecord
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


ROUTING_TOLERANCE = 0.1
"""The relative change of a replica's prefill or decode figure that is worth a new routing table."""


def metrics_speeds(records: Iterable[NodeRecord]) -> dict[str, ReplicaSpeed]:
    """Replica id -> the speed its engine's counters gave (`NodeRecord.speeds`; of several shards, the one measured
    last), for replicas with both a prefill and a decode figure. Lost nodes are left out."""
    out: dict[str, ReplicaSpeed] = {}
    for record in records:
        if record.lost or not record.speeds:
            continue
        for shard in record.state.shards:
            measured = record.speeds.get(shard.shard_id)
            speed = measured.replica_speed() if measured is not None and shard.replica_id else None
            if speed is None:
                continue
            kept = out.get(shard.replica_id)
            if kept is None or speed.measured_at > kept.measured_at:
                out[shard.replica_id] = speed
    return out


def merged_speeds(bench: Mapping[str, ReplicaSpeed], measured: Mapping[str, ReplicaSpeed]) -> dict[str, ReplicaSpeed]:
    """Replica id -> the speed routing uses: of its `bench` speed and its `measured` (metrics) speed, the newer
    (`measured_at`; a tie goes to the bench); a metrics speed that wins takes the bench's `slots`."""
    out = dict(bench)
    for replica, speed in measured.items():
        kept = bench.get(replica)
        if kept is None:
            out[replica] = speed
        elif speed.measured_at > kept.measured_at:
            out[replica] = replace(speed, slots=kept.slots)
    return dict(sorted(out.items()))


def routing_changed(old: Mapping[str, ReplicaSpeed], new: Mapping[str, ReplicaSpeed],
                    tolerance: float = ROUTING_TOLERANCE) -> bool:
    """Whether routing by `new` differs from routing by `old`: a replica gained or lost its speed, its source or
    slots changed, or its prefill or decode figure moved by more than `tolerance` (relative to the old one)."""
    if old.keys() != new.keys():
        return True
    for replica, speed in new.items():
        was = old[replica]
        if (was.source, was.slots) != (speed.source, speed.slots):
            return True
        for before, now in ((was.prefill_tokens_per_second, speed.prefill_tokens_per_second),
                            (was.decode_tokens_per_second, speed.decode_tokens_per_second)):
            if abs(now - before) > tolerance * before:
                return True
    return False


def speed_document(speed: ReplicaSpeed, now: float) -> dict[str, object]:
    """One replica's speed as the status document shows it: figures in tokens/s (rounded to 0.1), `slots`,
    `source` ("bench", "metrics"), `measured_at_unix` and `age_seconds` at `now` (unix seconds; rounded to 1 s)."""
    return {"prefill_tokens_per_second": round(speed.prefill_tokens_per_second, 1),
            "decode_tokens_per_second": round(speed.decode_tokens_per_second, 1), "slots": speed.slots,
            "source": speed.source, "measured_at_unix": speed.measured_at,
            "age_seconds": round(max(0.0, now - speed.measured_at))}

"""Results of `llmgw bench` on SQLite and PostgreSQL: kept with their replica, node class and engine build, read
back newest first (per replica too), and copied with the rest of a store."""

from __future__ import annotations

from llmgw.store import BenchRecord, open_store
from llmgw.store.copying import copy_store


def _bench(replica: str, when: float, tokens_per_second: float, build: str = "b11434") -> BenchRecord:
    return BenchRecord(time=when, replica=replica, model="gemma", node="n1", node_class="2x H200",
                       engine_build=build, via="engine", prompt_tokens=128, output_tokens=64, concurrency=4,
                       requests=16, ttft_p50_seconds=0.05, ttft_p90_seconds=0.08, itl_p50_seconds=None,
                       output_tokens_per_second=tokens_per_second,
                       summary={"ttft_seconds": {"p50": 0.05, "p99": 0.1}, "errors": ["héllo ✓"]})


def test_a_bench_is_kept_with_its_replica_node_class_and_build_and_read_newest_first(store):
    first = store.record_bench(_bench("gemma-0", 1000.0, 900.0))
    second = store.record_bench(_bench("gemma-1", 1001.0, 20.0, build="b0-unknown"))
    third = store.record_bench(_bench("gemma-0", 1002.0, 950.0))
    assert first < second < third
    assert [(b.replica, b.output_tokens_per_second) for b in store.benches()] == [
        ("gemma-0", 950.0), ("gemma-1", 20.0), ("gemma-0", 900.0)]
    latest = store.benches(replica="gemma-1")
    assert len(latest) == 1 and latest[0].engine_build == "b0-unknown" and latest[0].node_class == "2x H200"
    assert latest[0].id == second and latest[0].itl_p50_seconds is None and latest[0].ttft_p90_seconds == 0.08
    assert latest[0].summary == {"ttft_seconds": {"p50": 0.05, "p99": 0.1}, "errors": ["héllo ✓"]}
    assert store.benches(limit=1)[0].id == third
    assert store.benches(replica="nobody") == []


def test_benches_travel_with_a_store_copy_and_new_ones_are_numbered_after_them(store, tmp_path):
    store.record_bench(_bench("gemma-0", 1000.0, 900.0))
    target = open_store(tmp_path / "copy.sqlite3")
    try:
        copy_store(store, target)
        assert [b.output_tokens_per_second for b in target.benches()] == [900.0]
        assert target.record_bench(_bench("gemma-0", 1001.0, 1.0)) == 2
    finally:
        target.close()

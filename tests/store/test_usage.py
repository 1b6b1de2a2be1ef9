"""Usage records: summed per model, project and day; committed before `record_usage` returns."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import pytest

from llmgw.errors import UsageError
from llmgw.store import Store, UsageRecord, open_store

DAY1 = datetime(2027, 5, 1, 12, tzinfo=timezone.utc).timestamp()
DAY2 = datetime(2027, 5, 2, 8, tzinfo=timezone.utc).timestamp()


def fill(store: Store) -> None:
    store.record_usage(UsageRecord("chat", "gemma", DAY1, key_id="key_1", replica="gemma-0", node="n1",
                                   prompt_tokens=10, completion_tokens=20, cached_tokens=4, ttft_seconds=0.1,
                                   duration_seconds=1.0, cost=0.01))
    store.record_usage(UsageRecord("chat", "gemma", DAY2, prompt_tokens=5, completion_tokens=0, status=502,
                                   duration_seconds=3.0))
    store.record_usage(UsageRecord("search", "qwen", DAY2 + 60, prompt_tokens=1, completion_tokens=2,
                                   ttft_seconds=0.3, duration_seconds=2.0, cost=0.5))


def test_usage_is_summed_per_model(store: Store) -> None:
    fill(store)
    gemma, qwen = store.query_usage(by="model")
    assert (gemma.group, gemma.requests, gemma.errors) == ("gemma", 2, 1)
    assert (gemma.prompt_tokens, gemma.completion_tokens, gemma.cached_tokens) == (15, 20, 4)
    assert gemma.cost == pytest.approx(0.01)
    assert gemma.mean_ttft_seconds == pytest.approx(0.1)  # only requests with a TTFT count
    assert gemma.mean_duration_seconds == pytest.approx(2.0)
    assert (qwen.group, qwen.requests, qwen.cost) == ("qwen", 1, 0.5)


def test_usage_is_summed_per_project_and_per_utc_day(store: Store) -> None:
    fill(store)
    assert [(r.group, r.requests) for r in store.query_usage(by="project")] == [("chat", 2), ("search", 1)]
    assert [(r.group, r.requests) for r in store.query_usage(by="day")] == [("2027-05-01", 1), ("2027-05-02", 2)]


def test_usage_is_filtered_by_project_and_since(store: Store) -> None:
    fill(store)
    assert [(r.group, r.requests) for r in store.query_usage(project="chat", by="day")] == \
        [("2027-05-01", 1), ("2027-05-02", 1)]
    assert [(r.group, r.requests) for r in store.query_usage(since=DAY2, by="project")] == \
        [("chat", 1), ("search", 1)]
    assert store.query_usage(project="nobody") == []


def test_usage_is_filtered_by_model_with_or_without_a_project(store: Store) -> None:
    fill(store)  # the console's usage per day of a chosen project and model
    assert [(r.group, r.requests) for r in store.query_usage(by="day", model="gemma")] == \
        [("2027-05-01", 1), ("2027-05-02", 1)]
    assert [(r.group, r.requests) for r in store.query_usage(["chat", "search"], by="day", model="qwen")] == \
        [("2027-05-02", 1)]
    assert store.query_usage("chat", by="day", model="qwen") == []


def test_recent_usage_returns_whole_records_newest_first(store: Store) -> None:
    fill(store)
    latest = store.recent_usage(limit=2)
    assert [r.model for r in latest] == ["qwen", "gemma"]
    first = store.recent_usage(project="chat")[-1]
    assert first == UsageRecord("chat", "gemma", DAY1, key_id="key_1", replica="gemma-0", node="n1",
                                prompt_tokens=10, completion_tokens=20, cached_tokens=4, ttft_seconds=0.1,
                                duration_seconds=1.0, cost=0.01)


def test_a_canarys_requests_are_read_by_model_replica_settings_commit_and_time(store: Store) -> None:
    def record(time: float, replica: str, commit: str | None, model: str = "gemma", status: int = 200) -> None:
        store.record_usage(UsageRecord("chat", model, time, replica=replica, settings_commit=commit, status=status,
                                       ttft_seconds=0.4 if status == 200 else None, duration_seconds=1.0))
    record(DAY1, "gemma-0@canary", "b" * 40)  # before the canary was ready
    record(DAY2, "gemma-0@canary", "b" * 40)
    record(DAY2 + 1, "gemma-0@canary", "b" * 40, status=502)
    record(DAY2 + 2, "gemma-0", "a" * 40)  # an old replica
    record(DAY2 + 3, "gemma-0@canary", "c" * 40)  # another revision's canary
    record(DAY2 + 4, "gemma-0@canary", "b" * 40, model="qwen")
    found = store.usage_of_replica("gemma", "gemma-0@canary", "b" * 40, DAY2)
    assert [(r.time, r.status, r.ttft_seconds) for r in found] == [(DAY2 + 1, 502, None), (DAY2, 200, 0.4)]


def test_a_models_recent_ttfts_leave_out_failures_batch_lines_and_other_models(store: Store) -> None:
    """The autoscaler's TTFT target reads them (llmgw.control.autoscaling): a request answered without streaming
    counts its duration."""
    store.record_usage(UsageRecord("chat", "gemma", DAY1, ttft_seconds=9.0, duration_seconds=9.0))  # too old
    store.record_usage(UsageRecord("chat", "gemma", DAY2, ttft_seconds=0.2, duration_seconds=1.0))
    store.record_usage(UsageRecord("chat", "gemma", DAY2 + 1, duration_seconds=0.7))  # not streamed
    store.record_usage(UsageRecord("chat", "gemma", DAY2 + 2, status=502, duration_seconds=5.0))
    store.record_usage(UsageRecord("chat", "gemma", DAY2 + 3, ttft_seconds=4.0, duration_seconds=5.0,
                                   batch_id="batch_1"))
    store.record_usage(UsageRecord("chat", "qwen", DAY2 + 4, ttft_seconds=3.0, duration_seconds=5.0))
    assert store.ttfts_of_model("gemma", DAY2) == [0.7, 0.2]
    assert store.ttfts_of_model("gemma", DAY2 + 10) == []


def test_an_unknown_grouping_is_a_usage_error(store: Store) -> None:
    with pytest.raises(UsageError, match="model, project, day"):
        store.query_usage(by="week")


KILLED_RIGHT_AFTER = textwrap.dedent("""
    import os, signal, sys
    from llmgw.store import open_store, UsageRecord
    store = open_store(sys.argv[1])
    for i in range(int(sys.argv[2])):
        store.record_usage(UsageRecord("chat", "gemma", 1.0 + i, prompt_tokens=i))
        print(i, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_record_survives_the_process_being_killed_right_after_record_usage(store_path: Path) -> None:
    child = subprocess.run([sys.executable, "-c", KILLED_RIGHT_AFTER, str(store_path), "3"],
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert (store_path.parent / (store_path.name + "-wal")).exists()  # it never closed cleanly
    store = open_store(store_path)
    try:
        assert [r.prompt_tokens for r in store.recent_usage()] == [2, 1, 0]
    finally:
        store.close()


def test_every_record_acknowledged_before_a_kill_from_outside_is_kept(store_url: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", KILLED_RIGHT_AFTER, store_url, "100000"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    acknowledged = -1
    assert child.stdout is not None
    for line in child.stdout:
        acknowledged = int(line)
        if acknowledged >= 200:
            os.kill(child.pid, signal.SIGKILL)
            break
    child.wait(timeout=30)
    store = open_store(store_url)
    try:
        kept = store.query_usage(by="project")[0].requests
        assert kept >= acknowledged + 1
    finally:
        store.close()


def test_the_load_of_the_last_days_is_summed_per_model_and_project_with_the_busiest_hour(store: Store) -> None:
    fill(store)
    hour = 3600 * (int(DAY2) // 3600)  # DAY2 is 08:00 UTC: its hour starts there
    for i, project in enumerate(["chat", "chat", "search"]):  # three more gemma requests in the hour of DAY2
        store.record_usage(UsageRecord(project, "gemma", hour + 600 * (i + 1), prompt_tokens=100, completion_tokens=10,
                                       ttft_seconds=0.2 + i))
    store.record_usage(UsageRecord("chat", "gemma", hour + 3600, prompt_tokens=1, ttft_seconds=9.0))  # the next hour
    load = store.usage_load(DAY2 - 1)
    pairs = {(p.model, p.project): (p.requests, p.errors, p.prompt_tokens, p.completion_tokens) for p in load.pairs}
    assert pairs == {("gemma", "chat"): (4, 1, 206, 20), ("gemma", "search"): (1, 0, 100, 10),
                     ("qwen", "search"): (1, 0, 1, 2)}
    assert load.busiest_hour == {"gemma": 4, "qwen": 1}  # DAY1's request is before `since`
    assert load.ttfts["gemma"] == (9.0, 2.2, 1.2, 0.2) and load.ttfts["qwen"] == (0.3,)
    assert store.usage_load(DAY2 - 1, ttft_limit=2).ttfts["gemma"] == (9.0, 2.2)

"""Quotas under contention: many threads and several processes on one store file never overspend."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time

from llmgw.routes import Quota
from llmgw.store import Reservation, Store, open_store

from .conftest import rows

NOW = 1_800_000_000.0
THREADS = 64


def run_threads(count: int, work) -> list:
    barrier = threading.Barrier(count)
    results: list = [None] * count
    errors: list[BaseException] = []

    def body(index: int) -> None:
        try:
            barrier.wait()
            results[index] = work(index)
        except BaseException as exc:  # collected and re-raised in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return results


def window_tokens(store: Store, scope: str) -> int:
    return int(rows(store, "SELECT coalesce(sum(tokens), 0) FROM quota_windows WHERE scope = ? AND period = 'minute'",
                    (scope,))[0][0])


def test_64_threads_never_overspend_a_tokens_per_minute_quota(store: Store) -> None:
    limit = 4000
    scopes = [("project:chat", Quota(tokens_per_minute=limit)), ("team:research", Quota(tokens_per_minute=10**6))]

    def estimate(index: int) -> int:
        return 50 + (index * 37) % 200

    def work(index: int) -> int:
        outcome = store.reserve(scopes, estimate(index), 0.0, NOW + 1)
        if isinstance(outcome, Reservation):
            store.settle(outcome, estimate(index), 0.0, NOW + 2)
            return estimate(index)
        return 0

    spent = run_threads(THREADS, work)
    admitted = [s for s in spent if s]
    assert sum(estimate(i) for i in range(THREADS)) > 2 * limit  # the quota really binds
    assert sum(admitted) <= limit
    assert limit - sum(admitted) < 250  # filled up to where the smallest refused request no longer fit
    # Refused requests consumed nothing, in either scope.
    assert window_tokens(store, "project:chat") == sum(admitted)
    assert window_tokens(store, "team:research") == sum(admitted)


def test_64_threads_never_hold_more_slots_than_concurrent_requests_and_leave_none(store: Store) -> None:
    scopes = [("project:chat", Quota(concurrent_requests=4))]
    lock = threading.Lock()
    state = {"in_flight": 0, "most": 0, "admitted": 0}

    def work(index: int) -> None:
        for attempt in range(20):
            outcome = store.reserve(scopes, 10, 0.0, NOW)
            if not isinstance(outcome, Reservation):
                time.sleep(0.001)
                continue
            with lock:
                state["in_flight"] += 1
                state["most"] = max(state["most"], state["in_flight"])
                state["admitted"] += 1
            time.sleep(0.002)
            with lock:
                state["in_flight"] -= 1
            if attempt % 2:
                store.release(outcome, NOW)
            else:
                store.settle(outcome, 10, 0.0, NOW)
            return

    run_threads(THREADS, work)
    assert 1 <= state["most"] <= 4
    assert state["admitted"] >= 4
    assert rows(store, "SELECT count(*) FROM quota_slots") == [(0,)]


CHILD = textwrap.dedent("""
    import sys, threading, json
    from llmgw.routes import Quota
    from llmgw.store import open_store, Reservation
    store = open_store(sys.argv[1])
    scopes = [("org:acme", Quota(tokens_per_minute=int(sys.argv[2])))]
    start = threading.Barrier(16)
    got = []
    def work(i):
        start.wait()
        for _ in range(5):
            outcome = store.reserve(scopes, 100, 0.0, float(sys.argv[3]))
            if isinstance(outcome, Reservation):
                got.append(100)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(json.dumps(sum(got)))
""")


def test_four_processes_sharing_the_store_never_overspend(store_url: str) -> None:
    open_store(store_url).close()
    limit = 10_000  # 4 processes x 16 threads x 5 tries x 100 tokens = 32,000 asked for
    children = [subprocess.Popen([sys.executable, "-c", CHILD, store_url, str(limit), str(NOW)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    totals = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        totals.append(json.loads(out))
    store = open_store(store_url)
    try:
        assert sum(totals) == limit  # all of it used, none of it twice
        assert window_tokens(store, "org:acme") == limit
    finally:
        store.close()

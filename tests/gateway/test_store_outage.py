"""A store that is locked or away never stalls the gateway, never costs an answer, and never loses or doubles usage.

Another process's write lock is a second sqlite3 connection in `BEGIN IMMEDIATE` on the same file: every write of
the gateway's store then waits for its busy timeout. The stores here wait 30 s (STUCK): a request that waited on
the store would run into the tests' 10 s deadlines.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager

import httpx
import openai
import pytest
import trio
import trio.testing
from gateway_harness import ProjectPolicy, Quota, make_table, replica, start_engine, start_gateway

from llmgw.errors import TemporaryError
from llmgw.store import open_store

STUCK = 30.0
MESSAGES = [{"role": "user", "content": "hello there"}]


@contextmanager
def write_lock(path):
    """Hold the SQLite file's write lock, as another process writing would, until the block ends."""
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        locker.execute("ROLLBACK")
        locker.close()


@pytest.fixture
def store_file(tmp_path):
    return tmp_path / "store.db"


@pytest.fixture
def opened():
    """Open stores with `opened(path, busy_timeout=...)`; each is closed when the test ends."""
    stores = []

    def open_one(path, **kwargs):
        stores.append(open_store(path, **kwargs))
        return stores[-1]

    yield open_one
    for store in stores:
        store.close()


def projects(concurrent: int | None = None) -> dict[str, ProjectPolicy]:
    return {
        "free": ProjectPolicy("free", "t", "o"),
        "metered": ProjectPolicy("metered", "t", "o",
                                 quotas=(("project:metered", Quota(concurrent_requests=concurrent or 1)),)),
    }


async def wait_for_usage(store, count: int) -> list:
    with trio.fail_after(10):
        while len(records := store.recent_usage(limit=1000)) < count:
            await trio.sleep(0.05)
    return records


async def test_health_and_requests_needing_no_store_write_are_answered_while_the_store_is_locked(
        nursery, store_file, opened):
    store = opened(store_file, busy_timeout=STUCK)
    _engine, url = await start_engine(nursery)
    gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]},
                                                                   projects=projects()), settle_wait=0.2)
    _key, cached = store.create_api_key("free")
    _key, fresh = store.create_api_key("free")
    client = openai.AsyncOpenAI(base_url=base, api_key=cached, max_retries=0)
    await client.chat.completions.create(model="gemma", messages=MESSAGES)  # the key is now cached

    with write_lock(store_file):
        with trio.fail_after(10):
            async with httpx.AsyncClient() as raw:
                assert (await raw.get(base.removesuffix("/v1") + "/health")).status_code == 200
            answers = []
            for plaintext in (cached, fresh, cached):  # a key not cached yet is read past the lock (WAL)
                other = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
                answers.append(await other.chat.completions.create(model="gemma", messages=MESSAGES))
            async with httpx.AsyncClient() as raw:  # while three settlements wait on the lock in worker threads
                assert (await raw.get(base.removesuffix("/v1") + "/health")).status_code == 200
        assert all(a.choices[0].message.content for a in answers)
        assert len(store.recent_usage(limit=100)) == 1  # the three wait in the spool
        assert gateway.accounting.boundary.statistics()["pending"] == 3

    records = await wait_for_usage(store, 4)
    await trio.sleep(2.5)  # two more retry rounds: nothing is written twice
    assert len(store.recent_usage(limit=100)) == 4
    assert [r.status for r in records] == [200] * 4
    assert gateway.accounting.boundary.statistics()["pending"] == 0


async def test_a_request_that_needs_a_reservation_gets_503_with_retry_after_while_the_store_is_locked(
        nursery, store_file, opened):
    store = opened(store_file, busy_timeout=0.3)
    _engine, url = await start_engine(nursery)
    _gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]},
                                                                    projects=projects()), settle_wait=0.2)
    _key, plaintext = store.create_api_key("metered")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    with write_lock(store_file):
        with pytest.raises(openai.InternalServerError) as refused:
            await client.chat.completions.create(model="gemma", messages=MESSAGES)
    assert refused.value.status_code == 503
    assert int(refused.value.response.headers["retry-after"]) >= 1
    error = refused.value.response.json()["error"]
    assert error["type"] == "service_unavailable" and error["code"] == "store_unavailable"
    assert "store" in error["message"]
    records = await wait_for_usage(store, 1)
    assert [r.status for r in records] == [503]
    await client.chat.completions.create(model="gemma", messages=MESSAGES)  # the store is back: admitted


async def test_a_stream_whose_settle_meets_a_locked_store_ends_normally_and_its_slot_is_freed_afterwards(
        nursery, store_file, opened):
    store = opened(store_file, busy_timeout=STUCK)
    engine, url = await start_engine(nursery, token_delay=0.05)
    gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]},
                                                                   projects=projects(concurrent=1)), settle_wait=0.2)
    _key, plaintext = store.create_api_key("metered")
    client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
    stream = await client.chat.completions.create(model="gemma", messages=MESSAGES, stream=True, max_tokens=10,
                                                  stream_options={"include_usage": True})
    chunks = []
    with trio.fail_after(10):
        async for chunk in stream:
            chunks.append(chunk)
            if len(chunks) == 2:
                locked = write_lock(store_file)
                locked.__enter__()  # the reservation is taken; the settlement will meet the lock
    try:
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
        assert gateway.accounting.boundary.statistics()["pending"] == 1
    finally:
        locked.__exit__(None, None, None)
    records = await wait_for_usage(store, 1)
    assert [(r.status, r.completion_tokens) for r in records] == [(200, 10)]
    with trio.fail_after(10):  # the one concurrency slot is free again
        answer = await client.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=2)
    assert answer.usage.completion_tokens == 2
    await trio.testing.wait_all_tasks_blocked()  # the engine counts a request done after its last bytes are sent
    assert engine.stats.processing == 0


@pytest.fixture
def postgres_url():
    """A PostgreSQL schema of this test's own (see tests/store/conftest.py); dropped at the end."""
    import os
    import secrets

    import psycopg

    base = os.environ.get("LLMGW_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")
    name = "llmgw_test_" + secrets.token_hex(6)
    with psycopg.connect(base, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    yield f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{name}"
    with psycopg.connect(base, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"DROP SCHEMA {name} CASCADE")


async def test_a_gateway_on_postgresql_answers_while_usage_is_locked_and_writes_it_once_afterwards(
        nursery, postgres_url, tmp_path):
    import psycopg

    store = open_store(postgres_url, busy_timeout=STUCK)
    try:
        _engine, url = await start_engine(nursery)
        gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]},
                                                                       projects=projects(concurrent=1)),
                                            settle_wait=0.2, spool_dir=tmp_path / "spool")
        _key, plaintext = store.create_api_key("metered")
        client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
        with psycopg.connect(postgres_url) as locker:  # another session holds the usage table
            locker.execute("LOCK TABLE usage IN ACCESS EXCLUSIVE MODE")
            with trio.fail_after(10):
                first = await client.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=3)
                assert gateway.accounting.boundary.statistics()["pending"] == 1
                with pytest.raises(openai.RateLimitError):  # its one slot is freed when the store takes the usage
                    await client.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=3)
            locker.rollback()
        assert first.usage.completion_tokens == 3
        records = await wait_for_usage(store, 2)
        with trio.fail_after(10):
            second = await client.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=3)
        assert second.usage.completion_tokens == 3
        await trio.sleep(2.5)
        assert sorted(r.status for r in store.recent_usage()) == [200, 200, 429]
        assert [r.status for r in records if r.status == 200] == [200]
    finally:
        store.close()


async def test_usage_a_crashed_gateway_left_in_its_spool_is_written_once_when_the_next_one_starts(
        nursery, store_file, opened):
    from llmgw.store import Settlement, UsageRecord, UsageSpool

    store = opened(store_file)
    left = UsageSpool(store_file.with_name(store_file.name + ".spool"))  # where a gateway on this store spools
    record = UsageRecord(project="free", model="gemma", time=1_800_000_000.0, prompt_tokens=7, completion_tokens=9)
    left.append(Settlement(entry_id="stl_left_by_a_crash", time=record.time, usage=record))
    left.close()  # the crashed gateway never told the store
    assert store.recent_usage() == []
    _engine, url = await start_engine(nursery)
    await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]}, projects=projects()))
    assert await wait_for_usage(store, 1) == [record]
    await trio.sleep(1.5)
    assert store.recent_usage() == [record]


async def _tcp_proxy(port: int, target_port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Forward 127.0.0.1:`port` to 127.0.0.1:`target_port` until cancelled (which drops every connection)."""
    async def pipe(source, sink) -> None:
        try:
            while data := await source.receive_some(65536):
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await sink.aclose()

    async def handle(client) -> None:
        try:
            server = await trio.open_tcp_stream("127.0.0.1", target_port)
        except OSError:
            await client.aclose()
            return
        async with trio.open_nursery() as both:
            both.start_soon(pipe, client, server)
            both.start_soon(pipe, server, client)

    await trio.serve_tcp(handle, port, host="127.0.0.1", task_status=task_status)


async def test_a_postgresql_that_goes_away_costs_new_admissions_a_503_and_admitted_answers_nothing(
        nursery, postgres_url, tmp_path):
    from urllib.parse import urlsplit

    parts = urlsplit(postgres_url)
    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    via_proxy = postgres_url.replace(parts.netloc, f"{parts.hostname}:{port}", 1)
    proxy = trio.CancelScope()

    async def run_proxy(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with proxy:
            await _tcp_proxy(port, parts.port or 5432, task_status=task_status)

    await nursery.start(run_proxy)
    # every call of the test's own goes through the proxy, which runs on this event loop: from a thread
    store = await trio.to_thread.run_sync(lambda: open_store(via_proxy, busy_timeout=1.0))
    try:
        engine, url = await start_engine(nursery, token_delay=0.05)
        gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]},
                                                                       projects=projects(concurrent=1)),
                                            settle_wait=0.2, spool_dir=tmp_path / "spool")
        _key, plaintext = await trio.to_thread.run_sync(store.create_api_key, "metered")
        client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
        await client.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=2)
        stream = await client.chat.completions.create(model="gemma", messages=MESSAGES, stream=True, max_tokens=8,
                                                      stream_options={"include_usage": True})
        chunks = []
        with trio.fail_after(15):
            async for chunk in stream:
                chunks.append(chunk)
                if len(chunks) == 2:
                    proxy.cancel()  # the database is gone: every connection dropped, nothing listens
            assert chunks[-1].usage.completion_tokens == 8  # the admitted answer arrived whole
            with pytest.raises(openai.InternalServerError) as refused:
                await client.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=2)
        assert refused.value.status_code == 503 and int(refused.value.response.headers["retry-after"]) >= 1
        assert gateway.accounting.boundary.statistics()["pending"] == 2  # the stream's usage and the 503
        proxy = trio.CancelScope()
        await nursery.start(run_proxy)  # the database is back
        with trio.fail_after(40):
            while True:
                try:  # the pool reconnects in the background: until then the test's own reads fail too
                    if len(await trio.to_thread.run_sync(lambda: store.recent_usage(limit=100))) >= 3:
                        break
                except TemporaryError:
                    pass
                await trio.sleep(0.2)
            answer = await client.chat.completions.create(model="gemma", messages=MESSAGES, max_tokens=2)
        assert answer.usage.completion_tokens == 2  # the stream's concurrency slot was freed
        await trio.sleep(1.5)
        statuses = sorted(r.status for r in await trio.to_thread.run_sync(lambda: store.recent_usage(limit=100)))
        assert statuses == [200, 200, 200, 503]
        assert engine.stats.processing == 0
    finally:
        await trio.to_thread.run_sync(store.close)

"""Settlements written as a group (one transaction, `Store.apply_settlements`) leave the store as written one by one."""

from __future__ import annotations

import pytest
import trio

from llmgw.routes import Quota
from llmgw.store import Reservation, Settlement, StoreBoundary, UsageSpool, open_store

from .test_spool import NOW, settlement

SCOPES = {name: [(f"project:{name}", Quota(concurrent_requests=4, requests_per_minute=100, tokens_per_minute=10_000,
                                           tokens_per_day=100_000, budget=50.0))]
          for name in ("a", "b", "B")}  # "B" sorts before "a" by code point, after it in most collations


def _entries(store) -> list[Settlement]:
    """Reservations of three projects settled, released, replayed and repeated, some a minute later."""
    reservations = [store.reserve(SCOPES[name], 100 + i, 0.5, NOW + i) for i, name in enumerate("abBab")]
    assert all(isinstance(r, Reservation) for r in reservations)
    first = settlement("stl_0", reservations[0], tokens=7, with_charges=True)
    return [first,
            settlement("stl_1", reservations[1], tokens=None, with_charges=True, at=NOW + 61),  # released next minute
            settlement("stl_2", reservations[2], tokens=30, with_charges=False),  # charges read from the row
            first,  # the same entry again in the group
            settlement("stl_3", reservations[3], tokens=9, with_charges=True, at=NOW + 61),
            settlement("stl_4", reservations[3], tokens=500, with_charges=True),  # its reservation closed above
            settlement("stl_5", None),  # usage only
            settlement("stl_6", reservations[4], tokens=0, with_charges=True)]


def _state(store) -> list:
    return [sorted(store.table_rows(table)) for table in ("quota_windows", "quota_slots", "quota_reservations")] + [
        sorted((r.project, r.prompt_tokens, r.completion_tokens) for r in store.recent_usage(limit=1000))]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_group_of_settlements_changes_the_store_as_the_same_settlements_one_by_one(backend, tmp_path,
                                                                                    request) -> None:
    stores = []
    for name in ("single", "group"):
        if backend == "sqlite":
            url = str(tmp_path / name / "llmgw.sqlite3")
        else:
            from .conftest import schema_url
            url = schema_url(request.getfixturevalue("postgres_schema") if name == "single"
                             else _another_schema(request))
        stores.append(open_store(url))
    single, group = stores
    try:
        entries_single, entries_group = _entries(single), _entries(group)
        # the group's reservation ids differ: compare what each settlement did, not the ids
        replayed = [entries_single[0]]
        one_by_one = [single.apply_settlement(e) for e in entries_single] + [single.apply_settlement(replayed[0])]
        grouped = group.apply_settlements(entries_group) + group.apply_settlements([entries_group[0]])
        assert one_by_one == grouped == [True, True, True, False, True, True, True, True, False]
        assert _state(single) == _state(group)
        assert _state(group)[1:3] == [[], []]  # every slot freed, every reservation closed
        later = NOW + 62
        assert group.headroom(SCOPES["a"], later).tokens.remaining == 10_000 - 9
        for name in ("a", "b", "B"):  # every slot is free again
            assert all(isinstance(group.reserve(SCOPES[name], 1, 0.0, later), Reservation) for _ in range(4))
    finally:
        for store in stores:
            store.close()


def _another_schema(request) -> str:
    import secrets

    import psycopg

    from .conftest import POSTGRES_URL

    name = "llmgw_test_" + secrets.token_hex(6)
    with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE SCHEMA {name}")

    def drop() -> None:
        with psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")

    request.addfinalizer(drop)
    return name


def test_an_empty_group_and_a_group_of_empty_settlements_write_nothing(store) -> None:
    assert store.apply_settlements([]) == []
    assert store.apply_settlements([Settlement(entry_id="stl_none", time=NOW)]) == [True]
    assert store.recent_usage() == []


async def test_settles_that_arrive_while_a_group_is_written_go_together_as_the_next_group(store, tmp_path) -> None:
    """Twenty settles at once: the first is written alone, the nineteen that queued behind it as one group; each
    settle hears that its own settlement was taken, and every usage row and slot is written or freed once."""
    scopes = [("project:chat", Quota(concurrent_requests=20, tokens_per_minute=100_000))]
    reservations = [store.reserve(scopes, 100, 0.0, NOW) for _ in range(20)]
    boundary = StoreBoundary(store, UsageSpool(tmp_path / "spool"))
    taken: list[bool] = []

    async def settle(index: int) -> None:
        taken.append(await boundary.settle(settlement(f"stl_{index}", reservations[index], tokens=5,
                                                      with_charges=index % 2 == 0)))

    try:
        async with trio.open_nursery() as nursery:
            for index in range(20):
                nursery.start_soon(settle, index)
        assert taken == [True] * 20
        assert boundary.statistics()["groups"] == 2
        assert boundary.statistics()["pending"] == 0
        assert len(store.recent_usage(limit=100)) == 20
        assert store.headroom(scopes, NOW + 2).tokens.remaining == 100_000 - 20 * 5
        assert sorted(store.table_rows("quota_slots")) == []
    finally:
        boundary.close()

"""Settlements written as a group (one transaction, `Store.apply_settlements`) leave the store as written one by one."""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from llmgw.routes import Quota
from llmgw.store import Rejection, Reservation, Settlement, StoreBoundary, UsageSpool, open_store

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


class _Waiting:
    """A real store whose every call may wait (as a PostgreSQL store's do): it has no `call_nowait`, so the boundary
    runs its calls in worker threads, in groups."""

    call_nowait = None

    def __init__(self, store) -> None:
        self.store = store

    def __getattr__(self, name):
        return getattr(self.store, name)


async def test_settles_that_arrive_while_a_group_is_written_go_together_as_the_next_group(store, tmp_path) -> None:
    """Twenty settles at once: the first is written alone, the nineteen that queued behind it as one group; each
    settle hears that its own settlement was taken, and every usage row and slot is written or freed once."""
    scopes = [("project:chat", Quota(concurrent_requests=20, tokens_per_minute=100_000))]
    reservations = [store.reserve(scopes, 100, 0.0, NOW) for _ in range(20)]
    boundary = StoreBoundary(_Waiting(store), UsageSpool(tmp_path / "spool"))
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


def test_a_group_of_reservations_admits_exactly_what_one_by_one_admits(store) -> None:
    """Seven requests against 3 requests per minute and 2 slots, with a negative estimate and an unlimited scope
    among them: each is decided on what those before it in the group left."""
    scopes = [("project:chat", Quota(requests_per_minute=3, concurrent_requests=2)), ("team:t", Quota())]
    requests = [(scopes, 10, 0.0, NOW)] * 2 + [(scopes, -1, 0.0, NOW), ([("team:t", Quota())], 5, 0.0, NOW)] + [
        (scopes, 10, 0.0, NOW)] * 3
    outcomes = store.reserve_many(requests)
    kinds = [type(outcome).__name__ for outcome in outcomes]
    assert kinds == ["Reservation", "Reservation", "UsageError", "Reservation", "Rejection", "Rejection", "Rejection"]
    assert outcomes[3].reservation_id is None  # no limit: nothing written
    assert {outcome.limit_name for outcome in outcomes[4:]} == {"concurrent_requests"}
    store.release(outcomes[0], NOW)
    later = store.reserve_many([(scopes, 10, 0.0, NOW + 1)] * 2)
    assert [type(outcome).__name__ for outcome in later] == ["Reservation", "Rejection"]
    assert later[1].limit_name == "requests_per_minute"


class _GatedStore(_Waiting):
    """A real store whose `reserve_many` first waits for its gate (one threading.Event per call, in order) to open:
    to hold a group while it is being written."""

    def __init__(self, store, calls: int) -> None:
        super().__init__(store)
        self.gates = [threading.Event() for _ in range(calls)]
        self.groups: list[int] = []
        self.lock = threading.Lock()

    def reserve_many(self, requests):
        with self.lock:
            gate = self.gates[len(self.groups)]
            self.groups.append(len(requests))
        gate.wait(10)
        return self.store.reserve_many(requests)


async def test_reservations_queued_behind_a_group_go_together_and_cancelled_ones_get_what_was_written(
        store, tmp_path) -> None:
    scopes = [("project:chat", Quota(concurrent_requests=3))]
    gated = _GatedStore(store, 2)
    boundary = StoreBoundary(gated, UsageSpool(tmp_path / "spool"))
    got: dict[str, object] = {}
    scopes_of: dict[str, trio.CancelScope] = {}

    async def reserve(name: str) -> None:
        with trio.CancelScope() as scope:
            scopes_of[name] = scope
            got[name] = await boundary.reserve(scopes, 10, 0.0, NOW)
            await trio.sleep_forever()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reserve, "first")  # written alone, held at the first gate
            await trio.testing.wait_all_tasks_blocked()
            for name in ("queued-then-cancelled", "second", "third", "fourth"):  # queued in this order
                nursery.start_soon(reserve, name)
                await trio.testing.wait_all_tasks_blocked()
            scopes_of["queued-then-cancelled"].cancel()  # never written
            await trio.testing.wait_all_tasks_blocked()
            gated.gates[0].set()
            while len(gated.groups) < 2:  # the next group is in the store, held at the second gate
                await trio.sleep(0.01)
            scopes_of["second"].cancel()
            scopes_of["third"].cancel()
            await trio.testing.wait_all_tasks_blocked()
            gated.gates[1].set()
            while len(got) < 4:
                await trio.sleep(0.01)
            for name in ("first", "fourth"):
                scopes_of[name].cancel()
        assert gated.groups == [1, 3]
        assert "queued-then-cancelled" not in got
        assert [type(got[name]).__name__ for name in ("first", "second", "third")] == ["Reservation"] * 3
        assert type(got["fourth"]).__name__ == "Rejection"  # three slots: the group decided in order
        assert boundary.statistics()["reservation_groups"] == 2
    finally:
        boundary.close()


async def test_a_reservation_cancelled_while_its_group_is_written_still_reaches_its_caller(store, tmp_path) -> None:
    scopes = [("project:chat", Quota(concurrent_requests=5))]
    gated = _GatedStore(store, 1)
    boundary = StoreBoundary(gated, UsageSpool(tmp_path / "spool"))
    got: list[object] = []

    async def reserve(scope: trio.CancelScope) -> None:
        with scope:
            got.append(await boundary.reserve(scopes, 10, 0.0, NOW))
            await trio.sleep_forever()

    try:
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()
            nursery.start_soon(reserve, scope)
            await trio.testing.wait_all_tasks_blocked()  # its group is in the store, held at the gate
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            gated.gates[0].set()
        assert len(got) == 1 and type(got[0]).__name__ == "Reservation"
        assert store.release(got[0], NOW) is True  # the caller has what the store wrote, and can free it
    finally:
        boundary.close()


def test_a_group_counts_the_tokens_of_the_reservations_before_it(store) -> None:
    """Three 400-token requests against 1,000 tokens per minute: one by one the third is refused, and so it is in one
    group (each request is decided on the tokens the ones before it in its group took)."""
    def requests(scope: str) -> list:
        return [([(scope, Quota(tokens_per_minute=1000))], 400, 0.0, NOW + i) for i in range(3)]

    one_by_one = [store.reserve(*request) for request in requests("project:single")]
    grouped = store.reserve_many(requests("project:group"))
    for outcomes in (one_by_one, grouped):
        assert [type(o).__name__ for o in outcomes] == ["Reservation", "Reservation", "Rejection"]
        assert (outcomes[2].limit_name, outcomes[2].remaining, outcomes[2].requested) == ("tokens_per_minute", 200, 400)
    windows = {scope: [row[3:] for row in store.table_rows("quota_windows") if row[0] == scope]
               for scope in ("project:single", "project:group")}
    assert windows["project:single"] == windows["project:group"] != []


KINDS = ("requests_per_minute", "tokens_per_minute", "tokens_per_day", "concurrent_requests", "budget")


def _random_limits(rng, kind: str, seed: int) -> dict[str, list]:
    """Two projects sharing a team, with small limits: of `kind` alone, or ("mixed") of every kind at random. Scope
    names carry the seed and kind, so no seed sees what another left in the store (day and month windows)."""
    if kind == "mixed":
        team = Quota(tokens_per_minute=rng.choice([None, 300, 800]), concurrent_requests=rng.choice([None, 3]))
        own = {p: Quota(requests_per_minute=rng.choice([None, 2, 4]), tokens_per_day=rng.choice([None, 500]),
                        budget=rng.choice([None, 1.0])) for p in "xy"}
    else:
        small = {"requests_per_minute": [2, 3], "tokens_per_minute": [300, 500], "tokens_per_day": [400, 700],
                 "concurrent_requests": [2, 3], "budget": [0.5, 1.0]}[kind]
        team = Quota(**{kind: rng.choice(small)}) if rng.random() < 0.5 else Quota()
        own = {p: Quota(**{kind: rng.choice(small)}) for p in "xy"}
    return {p: [(f"project:{p}-{kind}-{seed}", own[p]), (f"team:t-{kind}-{seed}", team)] for p in "xy"}


@pytest.mark.parametrize("kind", ("mixed", *KINDS))
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_random_groups_of_reservations_decide_as_one_by_one(backend, kind, tmp_path, request) -> None:
    """Seeded random groups (two projects sharing a team, small limits of one kind alone or of every kind, estimates
    near them, times across a minute boundary), each seed on scopes of its own: a group admits and refuses what the
    same requests one by one do, and leaves the same windows and slots; the limit under test refuses some."""
    import random

    urls = []
    for name in ("single", "group"):
        if backend == "sqlite":
            urls.append(str(tmp_path / name / "llmgw.sqlite3"))
        else:
            from .conftest import schema_url
            urls.append(schema_url(_another_schema(request)))
    single, group = (open_store(url) for url in urls)
    refused_by: set[str] = set()
    try:
        for seed in range(12):
            rng = random.Random(f"{kind}-{seed}")
            projects = _random_limits(rng, kind, seed)
            base = NOW + 50
            requests = [(projects[rng.choice("xy")], rng.choice([0, 50, 150, 400]), rng.choice([0.0, 0.3, 0.6]),
                         base + rng.choice([0.0, 5.0, 11.0])) for _ in range(rng.randint(1, 9))]
            one_by_one = [single.reserve(*r) for r in requests]
            grouped = group.reserve_many(requests)
            assert [type(o).__name__ for o in grouped] == [type(o).__name__ for o in one_by_one], seed
            assert [getattr(o, "limit_name", None) for o in grouped] == [getattr(o, "limit_name", None)
                                                                          for o in one_by_one], seed
            refused_by.update(o.limit_name for o in one_by_one if isinstance(o, Rejection))
            windows = [sorted(s.table_rows("quota_windows")) for s in (single, group)]
            assert windows[0] == windows[1], seed
            assert (len(list(single.table_rows("quota_slots"))) == len(list(group.table_rows("quota_slots")))), seed
    finally:
        single.close()
        group.close()
    assert refused_by >= (set(KINDS) - {"concurrent_requests"} if kind == "mixed" else {kind}), refused_by


async def test_a_group_held_in_the_store_holds_up_no_reservation_of_other_scopes(store, tmp_path) -> None:
    """A group waiting in the store (another gateway holding its scope, say) does not delay another project."""
    gated = _GatedStore(store, 2)
    gated.gates[1].set()
    boundary = StoreBoundary(gated, UsageSpool(tmp_path / "spool"))
    got: dict[str, object] = {}

    async def reserve(name: str) -> None:
        got[name] = await boundary.reserve([(f"project:{name}", Quota(concurrent_requests=1))], 10, 0.0, NOW)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reserve, "held")
            while not gated.groups:  # its thread has taken the first gate (a blocked task need not mean that yet)
                await trio.sleep(0.01)
            nursery.start_soon(reserve, "other")
            with trio.fail_after(10):
                while "other" not in got:
                    await trio.sleep(0.01)
            assert "held" not in got
            gated.gates[0].set()
        assert [type(got[name]).__name__ for name in ("held", "other")] == ["Reservation"] * 2
    finally:
        boundary.close()

"""Quota decisions as a property (hypothesis): a group of reservations (`Store.reserve_many`, one transaction, each
decided on the snapshot brought up to date in memory) admits, refuses and writes what the same requests reserved one
by one do, for every limit kind alone and for all of them at once. SQLite stores (tests/store/test_group_commit.py
runs seeded groups on PostgreSQL too); every example reserves on scopes of its own, so none sees another's usage."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.routes import Quota
from llmgw.store import Rejection, Store, open_store

NOW = 1_800_000_000.0 + 40  # 20 s before a minute ends: requests fall on both sides of the boundary
KINDS = ("requests_per_minute", "tokens_per_minute", "tokens_per_day", "concurrent_requests", "budget")
SMALL = {"requests_per_minute": st.integers(1, 4), "tokens_per_minute": st.integers(0, 900),
         "tokens_per_day": st.integers(0, 1500), "concurrent_requests": st.integers(1, 4),
         "budget": st.sampled_from([0.0, 0.4, 1.0, 1.5])}
_examples = itertools.count()


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> Iterator[tuple[Store, Store]]:
    """Two SQLite stores: one reserved on one request at a time, one in groups."""
    where = tmp_path_factory.mktemp("quota-properties")
    opened = (open_store(where / "single.sqlite3"), open_store(where / "group.sqlite3"))
    yield opened
    for store in opened:
        store.close()


def limits(kinds: tuple[str, ...]) -> st.SearchStrategy[Quota]:
    """A Quota with some of `kinds` set to small values (maybe none)."""
    return st.fixed_dictionaries({}, optional={kind: SMALL[kind] for kind in kinds}).map(lambda d: Quota(**d))


GROUPS = st.lists(st.tuples(st.integers(0, 1), st.sampled_from([0, 1, 150, 299, 300, 400, 901]),
                            st.sampled_from([0.0, 0.3, 0.5, 1.2]), st.sampled_from([0.0, 5.0, 25.0])),
                  min_size=1, max_size=8)
"""Requests of one group: (project 0 or 1, estimated tokens, estimated cost, seconds after NOW); both projects share
a team."""


def _check_grouped_equals_one_by_one(stores, team: Quota, projects: tuple[Quota, Quota], requests) -> None:
    single, group = stores
    n = next(_examples)
    scopes = [[(f"project:p{p}-{n}", projects[p]), (f"team:t-{n}", team)] for p in (0, 1)]
    asked = [(scopes[p], tokens, cost, NOW + later) for p, tokens, cost, later in requests]
    one_by_one = [single.reserve(*request) for request in asked]
    grouped = group.reserve_many(asked)

    def seen(outcome):
        if isinstance(outcome, Rejection):
            return ("refused", outcome.scope, outcome.limit_name, outcome.remaining, outcome.requested)
        return ("admitted", outcome.scopes, outcome.charges, outcome.slots, outcome.headroom)

    assert [seen(o) for o in grouped] == [seen(o) for o in one_by_one]
    mine = {f"project:p0-{n}", f"project:p1-{n}", f"team:t-{n}"}
    windows = [sorted(row for row in store.table_rows("quota_windows") if row[0] in mine) for store in stores]
    assert windows[0] == windows[1]
    slots = [sorted(row[1:] for row in store.table_rows("quota_slots") if row[1] in mine)  # ids differ
             for store in stores]
    assert slots[0] == slots[1]


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_group_decides_and_writes_as_one_by_one_for_each_limit_kind_alone(stores, kind, data):
    one = limits((kind,))
    _check_grouped_equals_one_by_one(stores, data.draw(one), (data.draw(one), data.draw(one)),
                                     data.draw(GROUPS))


@settings(max_examples=80, deadline=None)
@given(team=limits(KINDS), first=limits(KINDS), second=limits(KINDS), requests=GROUPS)
def test_a_group_decides_and_writes_as_one_by_one_with_every_limit_kind(stores, team, first, second, requests):
    _check_grouped_equals_one_by_one(stores, team, (first, second), requests)

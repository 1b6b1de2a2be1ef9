"""What counts against each limit now (`Store.quota_use`, the console's Quotas page), on both backends: read by the
quota check's own snapshot (`quotas.read_use` over `Snapshot.used`), so what it says is left is exactly what a
reservation may still take, per-minute limits slide, a day's and a month's reset at their window's end, and
requests in flight leave the concurrency limit when they end."""

from __future__ import annotations

from llmgw.routes import Quota
from llmgw.store import LimitUse, Rejection, Reservation, Store

NOW = 1_800_000_000.0  # the start of a minute window (a multiple of 60), 11:20 UTC on 2027-01-15

PROJECT = ("project:chat", Quota(requests_per_minute=3, tokens_per_minute=1000, concurrent_requests=2))
TEAM = ("team:research", Quota(tokens_per_day=5000, budget=10.0))
NONE = ("org:acme", Quota())


def uses(store: Store, now: float) -> dict[tuple[str, str], LimitUse]:
    return {(use.scope, use.limit_name): use for use in store.quota_use([PROJECT, TEAM, NONE], now)}


def test_use_is_what_the_quota_check_counts_and_what_it_leaves(store: Store) -> None:
    assert store.quota_use([NONE], NOW) == []
    fresh = uses(store, NOW)
    assert [key for key in fresh] == [("project:chat", "requests_per_minute"), ("project:chat", "tokens_per_minute"),
                                      ("project:chat", "concurrent_requests"), ("team:research", "tokens_per_day"),
                                      ("team:research", "budget")]  # scope order, then the limits' order
    assert all(use.used == 0 and use.remaining == use.limit for use in fresh.values())

    first = store.reserve([PROJECT, TEAM], 400, 1.5, now=NOW + 1)
    second = store.reserve([PROJECT, TEAM], 500, 2.0, now=NOW + 2)
    assert isinstance(first, Reservation) and isinstance(second, Reservation)
    now = uses(store, NOW + 3)
    assert [(use.used, use.remaining) for use in now.values()] == [(2, 1), (900, 100), (2, 0), (900, 4100), (3.5, 6.5)]
    assert now[("team:research", "tokens_per_day")].reset_seconds == 86400 - (NOW % 86400) - 3  # midnight UTC
    assert now[("project:chat", "tokens_per_minute")].reset_seconds == 2 + 1 + 60 - 3  # its newest bucket leaves

    # what is left is what the check admits: 100 tokens a minute more, not 101; no third request in flight
    refused = store.reserve([("project:chat", Quota(tokens_per_minute=1000))], 101, 0.0, now=NOW + 3)
    assert isinstance(refused, Rejection) and refused.remaining == now[("project:chat", "tokens_per_minute")].remaining
    assert isinstance(store.reserve([PROJECT], 0, 0.0, now=NOW + 3), Rejection)  # concurrency: 2 of 2

    store.settle(first, 300, 1.0, now=NOW + 4)  # ended: its slot is free, its actual use counts
    later = uses(store, NOW + 5)
    assert later[("project:chat", "concurrent_requests")].used == 1
    assert later[("project:chat", "tokens_per_minute")].used == 800 and later[("team:research", "budget")].used == 3.0
    assert later[("project:chat", "tokens_per_minute")].reset_seconds == 4 + 1 + 60 - 5  # settled at NOW + 4
    slid = uses(store, NOW + 4 + 61)  # the sliding minute has passed; the day and the month have not
    assert slid[("project:chat", "requests_per_minute")].used == 0 and slid[("project:chat", "tokens_per_minute")].used == 0
    assert slid[("team:research", "tokens_per_day")].used == 800

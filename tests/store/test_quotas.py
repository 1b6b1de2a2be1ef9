"""Quotas: every limit refuses at its edge, a refusal consumes nothing anywhere, settling replaces the estimate."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from llmgw.routes import Quota
from llmgw.store import Rejection, Reservation, Store, UsageRecord, open_store

from .conftest import rows

NOW = 1_800_000_000.0  # the start of a minute window (a multiple of 60)


def quota_rows(store: Store) -> tuple[list, list]:
    windows = rows(store, "SELECT scope, period, start, requests, tokens, cost FROM quota_windows ORDER BY 1, 2, 3")
    slots = rows(store, "SELECT scope FROM quota_slots ORDER BY 1")
    return windows, slots


def written(store: Store) -> list:
    """Everything quotas and usage have written."""
    return [*quota_rows(store), rows(store, "SELECT id FROM quota_reservations"), rows(store, "SELECT id FROM usage")]


def admitted(outcome: Reservation | Rejection) -> Reservation:
    assert isinstance(outcome, Reservation), outcome
    return outcome


def refused(outcome: Reservation | Rejection) -> Rejection:
    assert isinstance(outcome, Rejection), outcome
    return outcome


def test_scopes_without_limits_never_refuse_and_write_nothing(store: Store) -> None:
    scopes = [("project:chat", Quota()), ("team:research", Quota()), ("org:acme", Quota())]
    before = written(store)
    for _ in range(50):
        reservation = admitted(store.reserve(scopes, 10**9, 10**6, NOW))
        assert reservation.reservation_id is None
        assert store.settle(reservation, 10**9, 10**6, NOW)
        assert store.release(reservation, NOW)
    assert written(store) == before
    assert store.headroom(scopes, NOW).requests is None


def test_requests_per_minute_refuses_the_third_request_until_the_first_leaves_the_sliding_minute(store: Store) -> None:
    scopes = [("project:chat", Quota(requests_per_minute=2))]
    admitted(store.reserve(scopes, 10, 0.0, NOW + 1))
    second = admitted(store.reserve(scopes, 10, 0.0, NOW + 2))
    assert second.headroom.requests.remaining == 0 and second.headroom.requests.limit == 2
    rejection = refused(store.reserve(scopes, 10, 0.0, NOW + 15))
    assert (rejection.scope, rejection.limit_name, rejection.limit, rejection.remaining) == \
        ("project:chat", "requests_per_minute", 2, 0)
    assert rejection.reset_seconds == pytest.approx(48.0)  # both gone: the second's bucket [2, 3) + 60 s
    assert rejection.retry_after_seconds == pytest.approx(47.0)  # the first's bucket [1, 2) + 60 s
    assert not rejection.exceeds_limit
    assert "retry after 47 s" in rejection.message
    refused(store.reserve(scopes, 10, 0.0, NOW + 60))  # a fixed minute would have started afresh here
    refused(store.reserve(scopes, 10, 0.0, NOW + 61.9))
    admitted(store.reserve(scopes, 10, 0.0, NOW + 62))
    refused(store.reserve(scopes, 10, 0.0, NOW + 62.5))


def test_two_requests_1_7_s_apart_across_a_minute_boundary_are_one_too_many_at_one_per_minute(store: Store) -> None:
    """Issue 39: requests at 06:33:58.7 and 06:34:00.4 with requests_per_minute 1 were both admitted (fixed minute)."""
    scopes = [("project:chat", Quota(requests_per_minute=1))]
    boundary = datetime(2026, 12, 2, 6, 34, tzinfo=timezone.utc).timestamp()
    admitted(store.reserve(scopes, 10, 0.0, boundary - 1.3))
    rejection = refused(store.reserve(scopes, 10, 0.0, boundary + 0.4))
    assert rejection.limit_name == "requests_per_minute"
    assert 58.3 <= rejection.retry_after_seconds <= 59.3  # 60 s after the first, rounded up to its second
    refused(store.reserve(scopes, 10, 0.0, boundary + 58.6))
    admitted(store.reserve(scopes, 10, 0.0, boundary - 1.3 + 60 + rejection.retry_after_seconds - 58.3))


def test_tokens_per_minute_slide_and_the_retry_time_is_when_enough_has_left(store: Store) -> None:
    scopes = [("project:chat", Quota(tokens_per_minute=1000))]
    admitted(store.reserve(scopes, 300, 0.0, NOW + 10))
    admitted(store.reserve(scopes, 300, 0.0, NOW + 20))
    admitted(store.reserve(scopes, 300, 0.0, NOW + 30))
    rejection = refused(store.reserve(scopes, 500, 0.0, NOW + 40))  # 100 left: the first two must leave
    assert rejection.retry_after_seconds == pytest.approx(20 + 61 - 40)
    assert rejection.reset_seconds == pytest.approx(30 + 61 - 40)
    refused(store.reserve(scopes, 500, 0.0, NOW + 80))  # only the first has left
    admitted(store.reserve(scopes, 500, 0.0, NOW + 81))


def test_tokens_per_minute_counts_estimates_and_flags_a_request_larger_than_the_limit(store: Store) -> None:
    scopes = [("project:chat", Quota(tokens_per_minute=1000))]
    first = admitted(store.reserve(scopes, 600, 0.0, NOW))
    assert first.headroom.tokens.remaining == 400
    rejection = refused(store.reserve(scopes, 500, 0.0, NOW + 1))
    assert (rejection.limit_name, rejection.remaining, rejection.requested) == ("tokens_per_minute", 400, 500)
    huge = refused(store.reserve(scopes, 5000, 0.0, NOW + 1))
    assert huge.exceeds_limit and "shorten the request" in huge.message
    admitted(store.reserve(scopes, 400, 0.0, NOW + 2))


def test_tokens_per_day_resets_at_utc_midnight(store: Store) -> None:
    midnight = datetime(2027, 3, 4, tzinfo=timezone.utc).timestamp()
    scopes = [("org:acme", Quota(tokens_per_day=100))]
    admitted(store.reserve(scopes, 100, 0.0, midnight - 3600))
    rejection = refused(store.reserve(scopes, 1, 0.0, midnight - 10))
    assert rejection.limit_name == "tokens_per_day" and rejection.retry_after_seconds == pytest.approx(10.0)
    admitted(store.reserve(scopes, 100, 0.0, midnight))


def test_the_budget_is_per_utc_calendar_month(store: Store) -> None:
    scopes = [("team:research", Quota(budget=1.0))]
    start = datetime(2027, 12, 31, 23, 0, tzinfo=timezone.utc).timestamp()
    reservation = admitted(store.reserve(scopes, 10, 0.75, start))
    store.settle(reservation, 10, 0.90, start + 1)
    rejection = refused(store.reserve(scopes, 10, 0.2, start + 2))
    assert rejection.limit_name == "budget" and rejection.remaining == pytest.approx(0.10)
    assert rejection.retry_after_seconds == pytest.approx(3600 - 2)
    admitted(store.reserve(scopes, 10, 0.10, start + 3))  # exactly at the budget still fits
    admitted(store.reserve(scopes, 10, 0.5, datetime(2028, 1, 1, tzinfo=timezone.utc).timestamp()))


def test_concurrent_requests_hold_slots_until_settled_or_released(store: Store) -> None:
    scopes = [("project:chat", Quota(concurrent_requests=2))]
    a = admitted(store.reserve(scopes, 1, 0.0, NOW))
    b = admitted(store.reserve(scopes, 1, 0.0, NOW))
    rejection = refused(store.reserve(scopes, 1, 0.0, NOW))
    assert rejection.limit_name == "concurrent_requests" and rejection.retry_after_seconds == 1.0
    assert store.settle(a, 1, 0.0, NOW + 1)
    c = admitted(store.reserve(scopes, 1, 0.0, NOW + 1))
    assert store.release(b, NOW + 2)
    assert store.release(c, NOW + 2)
    assert quota_rows(store)[1] == []


def test_a_refusal_in_one_scope_consumes_nothing_in_any_scope(store: Store) -> None:
    scopes = [
        ("project:chat", Quota(requests_per_minute=100, tokens_per_minute=10_000, tokens_per_day=10**6,
                                     concurrent_requests=10, budget=100.0)),
        ("team:research", Quota(tokens_per_minute=10_000, concurrent_requests=10)),
        ("org:acme", Quota(tokens_per_minute=1_000)),
    ]
    admitted(store.reserve(scopes, 900, 1.0, NOW))
    before = quota_rows(store)
    assert len(before[0]) == 5 and len(before[1]) == 2  # 3 minute windows, a day, a month; 2 slots
    rejection = refused(store.reserve(scopes, 200, 1.0, NOW + 5))
    assert (rejection.scope, rejection.limit_name) == ("org:acme", "tokens_per_minute")
    assert quota_rows(store) == before
    # The team now refuses on concurrency (its one slot is taken): again nothing moves anywhere.
    narrow = [scopes[0], ("team:research", Quota(concurrent_requests=1)), scopes[2]]
    rejection = refused(store.reserve(narrow, 1, 0.0, NOW + 6))
    assert (rejection.scope, rejection.limit_name) == ("team:research", "concurrent_requests")
    assert quota_rows(store) == before


def test_the_longest_wait_is_reported_when_several_limits_refuse(store: Store) -> None:
    scopes = [("project:chat", Quota(tokens_per_minute=10, tokens_per_day=10))]
    admitted(store.reserve(scopes, 10, 0.0, NOW))
    rejection = refused(store.reserve(scopes, 5, 0.0, NOW + 1))
    assert rejection.limit_name == "tokens_per_day"
    assert rejection.headroom.tokens.remaining == 0


def test_settling_replaces_the_estimate_with_the_actual_tokens(store: Store) -> None:
    scopes = [("project:chat", Quota(tokens_per_minute=1000))]
    reservation = admitted(store.reserve(scopes, 800, 0.0, NOW))
    assert store.settle(reservation, 120, 0.0, NOW + 2)
    assert store.headroom(scopes, NOW + 3).tokens.remaining == 880
    assert not store.settle(reservation, 999, 0.0, NOW + 4)  # a second settle changes nothing
    assert not store.release(reservation, NOW + 4)
    assert store.headroom(scopes, NOW + 5).tokens.remaining == 880


def test_tokens_settled_later_count_from_the_settle_time(store: Store) -> None:
    scopes = [("project:chat", Quota(tokens_per_minute=1000))]
    reservation = admitted(store.reserve(scopes, 500, 0.0, NOW + 50))
    assert store.headroom(scopes, NOW + 69).tokens.remaining == 500
    store.settle(reservation, 300, 0.0, NOW + 70)
    assert store.headroom(scopes, NOW + 71).tokens.remaining == 700
    assert store.headroom(scopes, NOW + 130.5).tokens.remaining == 700  # the estimate's bucket has long left
    assert store.headroom(scopes, NOW + 131).tokens.remaining == 1000


def test_releasing_refunds_tokens_and_cost_but_the_request_still_counts(store: Store) -> None:
    scopes = [("project:chat", Quota(requests_per_minute=5, tokens_per_minute=1000, budget=2.0))]
    reservation = admitted(store.reserve(scopes, 700, 1.5, NOW))
    assert store.release(reservation, NOW + 1)
    headroom = store.headroom(scopes, NOW + 1)
    assert headroom.tokens.remaining == 1000 and headroom.requests.remaining == 4
    admitted(store.reserve(scopes, 1000, 2.0, NOW + 2))


def test_settle_can_record_usage_in_the_same_transaction(store: Store) -> None:
    scopes = [("project:chat", Quota(tokens_per_minute=1000))]
    reservation = admitted(store.reserve(scopes, 100, 0.0, NOW))
    record = UsageRecord(project="chat", model="gemma", time=NOW + 1, prompt_tokens=7, completion_tokens=5)
    store.settle(reservation, 12, 0.0, NOW + 1, usage=record)
    assert store.recent_usage() == [record]
    unlimited = admitted(store.reserve([("project:free", Quota())], 100, 0.0, NOW))
    store.settle(unlimited, 12, 0.0, NOW + 1, usage=record)
    assert len(store.recent_usage()) == 2


def test_slots_of_a_crashed_gateway_are_reclaimed_after_their_ttl(store_url: str) -> None:
    scopes = [("project:chat", Quota(concurrent_requests=1))]
    crashed = open_store(store_url, slot_ttl=30.0)
    admitted(crashed.reserve(scopes, 1, 0.0, NOW))
    crashed.close()  # never settles: the process is gone
    survivor = open_store(store_url, slot_ttl=30.0)
    try:
        assert refused(survivor.reserve(scopes, 1, 0.0, NOW + 29)).limit_name == "concurrent_requests"
        admitted(survivor.reserve(scopes, 1, 0.0, NOW + 31))
        assert rows(survivor, "SELECT count(*) FROM quota_slots") == [(2,)]  # not yet pruned
        survivor.reserve([("project:other", Quota(concurrent_requests=5))], 1, 0.0, NOW + 2000)
        assert rows(survivor, "SELECT count(*) FROM quota_slots") == [(1,)]  # pruned
    finally:
        survivor.close()


def test_renewing_keeps_a_long_request_in_its_slot(store_url: str) -> None:
    store = open_store(store_url, slot_ttl=30.0)
    scopes = [("project:chat", Quota(concurrent_requests=1))]
    try:
        long_stream = admitted(store.reserve(scopes, 1, 0.0, NOW))
        assert store.renew(long_stream, NOW + 25)
        refused(store.reserve(scopes, 1, 0.0, NOW + 50))
        store.settle(long_stream, 1, 0.0, NOW + 51)
        assert not store.renew(long_stream, NOW + 52)
        admitted(store.reserve(scopes, 1, 0.0, NOW + 52))
    finally:
        store.close()


def test_headroom_reports_the_tightest_scope(store: Store) -> None:
    scopes = [
        ("project:chat", Quota(requests_per_minute=10, tokens_per_minute=5000)),
        ("team:research", Quota(requests_per_minute=3, tokens_per_day=2000)),
    ]
    admitted(store.reserve(scopes, 1500, 0.0, NOW + 30))
    headroom = store.headroom(scopes, NOW + 30)
    assert (headroom.requests.scope, headroom.requests.limit, headroom.requests.remaining) == ("team:research", 3, 2)
    assert headroom.requests.reset_seconds == pytest.approx(61.0)  # its bucket [30, 31) counts 60 s more
    assert (headroom.tokens.scope, headroom.tokens.limit_name, headroom.tokens.remaining) == \
        ("team:research", "tokens_per_day", 500)


def test_negative_estimates_are_a_usage_error(store: Store) -> None:
    from llmgw.errors import UsageError

    with pytest.raises(UsageError):
        store.reserve([("project:chat", Quota(tokens_per_minute=1))], -1, 0.0, NOW)

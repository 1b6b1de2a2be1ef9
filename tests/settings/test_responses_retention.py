"""`store.responses_retention` of llmgw.yaml: 30 days unless set, a duration, reaching the gateway's routing table."""

from __future__ import annotations

import pytest

from llmgw.routes import RouteTable
from llmgw.settings.building import build_cluster


@pytest.mark.parametrize(("store", "seconds"), [({}, 30 * 86400.0), ({"responses_retention": "7d"}, 7 * 86400.0),
                                                ({"kind": "sqlite", "responses_retention": "90m"}, 5400.0)])
def test_the_retention_is_thirty_days_unless_set(store, seconds):
    assert build_cluster({"name": "c", "store": store}).store.responses_retention == seconds


def test_the_routing_tables_default_is_the_settings_default():
    assert RouteTable().responses_retention_seconds == build_cluster({"name": "c"}).store.responses_retention


def test_a_new_retention_is_not_reported_as_waiting_for_a_restart_but_a_new_store_path_is():
    from llmgw.settings import restart_only_changes

    before = build_cluster({"name": "c"})
    retention = build_cluster({"name": "c", "store": {"responses_retention": "1d"}})
    moved = build_cluster({"name": "c", "store": {"path": "other.sqlite3"}})
    assert restart_only_changes(before, retention) == ()
    assert [c.path for c in restart_only_changes(before, moved)] == ["store.path"]

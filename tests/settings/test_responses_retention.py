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

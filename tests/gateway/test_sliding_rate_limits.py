"""Per-minute limits slide (issue 39 item 3): no window edge lets two requests through at one per minute.

Requests at 06:33:58.7 and 06:34:00.4 with `requests_per_minute: 1` were both admitted when the minute was a fixed
window. The gateway's clock is injected (`Gateway(clock=...)`), so no test sleeps; the store is SQLite and the real
PostgreSQL (`store_url` of test_gateway_workers: a fresh schema of the test database).
"""

from __future__ import annotations

from datetime import datetime, timezone

import openai
import pytest
from gateway_harness import ProjectPolicy, Quota, make_table, replica, start_engine, start_gateway
from test_gateway_workers import store_url  # noqa: F401 - a fixture

from llmgw.store import open_store

USER = [{"role": "user", "content": "hi"}]
BOUNDARY = datetime(2026, 12, 2, 6, 34, tzinfo=timezone.utc).timestamp()


async def test_two_requests_1_7_s_apart_across_a_minute_boundary_the_second_gets_429_with_retry_after(
        nursery, store_url, tmp_path):  # noqa: F811 - the fixture imported above
    store = open_store(store_url)
    try:
        now = [BOUNDARY - 1.3]
        _engine, url = await start_engine(nursery)
        projects = {"chat": ProjectPolicy("chat", "t", "o", quotas=(("project:chat", Quota(requests_per_minute=1)),))}
        _gateway, base = await start_gateway(nursery, store, make_table({"gemma": [replica("g-1", url)]},
                                                                        projects=projects), clock=lambda: now[0],
                                         spool_dir=tmp_path / "spool")
        _key, plaintext = store.create_api_key("chat")
        client = openai.AsyncOpenAI(base_url=base, api_key=plaintext, max_retries=0)
        first = await client.chat.completions.with_raw_response.create(model="gemma", messages=USER, max_tokens=4)
        assert first.headers["x-ratelimit-remaining-requests"] == "0"
        now[0] = BOUNDARY + 0.4
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model="gemma", messages=USER, max_tokens=4)
        assert refused.value.response.headers["retry-after"] == "59"  # 58.3 s to the first's minute, its second up
        assert refused.value.response.headers["x-ratelimit-remaining-requests"] == "0"
        now[0] = BOUNDARY - 1.3 + 60.0
        with pytest.raises(openai.RateLimitError):  # a minute after the first, in the same second: still counted
            await client.chat.completions.create(model="gemma", messages=USER, max_tokens=4)
        now[0] = BOUNDARY - 1.3 + 60.3
        await client.chat.completions.create(model="gemma", messages=USER, max_tokens=4)
        assert [r.status for r in store.recent_usage(limit=10)][::-1] == [200, 429, 429, 200]
    finally:
        store.close()

"""The concurrency slot is taken before a body over 1 MiB is read (issue 19 item 4, defect 6: the quota was
checked only after the body, so a key holder could hold many connections each buffering up to 10 MiB past its
concurrency quota)."""

from __future__ import annotations

import httpx
import trio
from gateway_harness import ProjectPolicy, Quota, make_table, replica, start_engine, start_gateway

from llmgw.gateway.early_slots import EARLY_SLOT_BYTES, body_may_be_big, slot_quotas

SMALL = {"model": "gemma", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def _gateway_with_one_slot(nursery, store):
    _engine, url = await start_engine(nursery)
    quotas = (("project:chat", Quota(concurrent_requests=1, tokens_per_day=10**9)),)
    table = make_table({"gemma": [replica("g-1", url)]},
                       projects={"chat": ProjectPolicy("chat", "research", "acme", quotas=quotas)})
    _gateway, base = await start_gateway(nursery, store, table)
    _key, plaintext = store.create_api_key("chat")
    return base, plaintext


async def _status_of_small(client: httpx.AsyncClient) -> int:
    return (await client.post("/chat/completions", json=SMALL)).status_code


async def _wait_for_status(client: httpx.AsyncClient, status: int, seconds: float = 30.0) -> None:
    # a deadline for a loaded machine, not a timing claim: the status must come at all
    with trio.fail_after(seconds):
        while await _status_of_small(client) != status:
            await trio.sleep(0.05)


async def test_a_body_over_one_mebibyte_holds_the_projects_slot_before_it_is_read(nursery, store):
    base, key = await _gateway_with_one_slot(nursery, store)
    port = int(base.rsplit(":", 1)[1].split("/")[0])
    async with httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {key}"}, timeout=10) as client:
        assert await _status_of_small(client) == 200
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        # 2 MiB declared, 20 bytes sent: the body is far from read, and the project's only slot is already taken
        await stream.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                              b"authorization: Bearer " + key.encode() + b"\r\ncontent-length: "
                              + str(2 * EARLY_SLOT_BYTES).encode() + b"\r\n\r\n{\"model\": \"gemma\", ")
        await _wait_for_status(client, 429)
        second = await trio.open_tcp_stream("127.0.0.1", port)
        async with second:  # a second big body is refused at once, before a byte of it is sent
            await second.send_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                                  b"\r\nauthorization: Bearer " + key.encode() + b"\r\ncontent-length: "
                                  + str(5 * EARLY_SLOT_BYTES).encode() + b"\r\n\r\n")
            answer = b""
            with trio.fail_after(30):
                while b"\r\n\r\n" not in answer:
                    answer += await second.receive_some(4096)
            assert answer.startswith(b"HTTP/1.1 429") and b"retry-after" in answer.lower()
        await stream.aclose()  # the client leaves: its slot is freed
        await _wait_for_status(client, 200)


async def test_a_whole_big_body_takes_one_slot_not_two(nursery, store):
    base, key = await _gateway_with_one_slot(nursery, store)
    big = {**SMALL, "messages": [{"role": "user", "content": "word " * (EARLY_SLOT_BYTES // 4)}]}
    async with httpx.AsyncClient(base_url=base, headers={"authorization": f"Bearer {key}"}, timeout=30) as client:
        answer = await client.post("/chat/completions", json=big)
        assert answer.status_code == 200, answer.text
        assert await _status_of_small(client) == 200  # nothing left held
    assert [row[1] for row in store.table_rows("quota_slots")] == []


def test_only_bodies_that_may_exceed_one_mebibyte_take_their_slot_early():
    assert not body_may_be_big({b"content-length": str(EARLY_SLOT_BYTES).encode()})
    assert body_may_be_big({b"content-length": str(EARLY_SLOT_BYTES + 1).encode()})
    assert body_may_be_big({})  # chunked, or HTTP/2 without a length: size unknown
    assert body_may_be_big({b"content-length": b"12, 12"})
    quotas = (("project:p", Quota(concurrent_requests=2, tokens_per_minute=100)),
              ("team:t", Quota(requests_per_minute=5)))
    assert slot_quotas(quotas) == (("project:p", Quota(concurrent_requests=2)),)

"""A batch yields to interactive requests (the llama-server stand-in, 2 slots, `batch_slot_share` 0.5): while two
interactive streams fill both slots no batch line starts; then the batch takes one slot at a time, so an interactive
request sent meanwhile finds a free slot and the engine never holds more requests than its slots. Time: about 2 s."""

from __future__ import annotations

import json

import openai
import trio
from gateway_harness import make_table, replica, start_engine, start_gateway

from llmgw.gateway.batch_runner import BatchRunner
from llmgw.routes import ReplicaSpeed


def _starts_and_ends(records) -> list[tuple[float, float]]:
    return sorted((r.time - r.duration_seconds, r.time) for r in records)


async def test_a_batch_waits_for_interactive_requests_and_takes_only_its_share(nursery, store):
    engine, url = await start_engine(nursery, alias="tiny", token_delay=0.03)
    table = make_table({"tiny": [replica("r-0", url, speed=ReplicaSpeed(100.0, 100.0, slots=2))]})
    gateway, base = await start_gateway(nursery, store, table)
    await nursery.start(BatchRunner(gateway, "cp-test", poll=0.2).run)
    sdk = openai.AsyncOpenAI(base_url=base, api_key=store.create_api_key("chat")[1], max_retries=0)
    most = 0

    async def watch_engine() -> None:
        nonlocal most
        while True:
            most = max(most, engine.stats.processing)
            await trio.sleep(0.002)

    async def interactive(tokens: int) -> None:
        stream = await sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=tokens, stream=True)
        async for _chunk in stream:
            pass

    nursery.start_soon(watch_engine)
    rows = [json.dumps({"custom_id": f"b-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5}}) for i in range(4)]
    upload = await sdk.files.create(file=("in.jsonl", "\n".join(rows).encode()), purpose="batch")
    async with trio.open_nursery() as busy:
        for _ in range(2):
            busy.start_soon(interactive, 20)
        await trio.sleep(0.1)  # both slots taken
        batch = await sdk.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                         completion_window="24h")
        await trio.sleep(0.3)
        assert (await sdk.batches.retrieve(batch.id)).request_counts.completed == 0
    with trio.fail_after(20):
        while (await sdk.batches.retrieve(batch.id)).request_counts.completed < 1:
            await trio.sleep(0.02)
    await interactive(5)  # sent while the batch runs: it finds the slot the batch leaves free
    with trio.fail_after(20):
        while (done := await sdk.batches.retrieve(batch.id)).status != "completed":
            await trio.sleep(0.05)
    assert done.request_counts.completed == 4
    records = store.recent_usage(limit=100)
    batch_runs = _starts_and_ends(r for r in records if r.batch_id == batch.id)
    first_two = _starts_and_ends(r for r in records if r.batch_id is None)[:2]
    assert min(start for start, _end in batch_runs) >= min(end for _start, end in first_two) - 0.01
    assert all(later[0] >= earlier[1] - 0.01 for earlier, later in zip(batch_runs, batch_runs[1:]))  # one at a time
    assert most <= 2  # the engine never had more requests than slots: nothing queued behind the batch
    assert done.request_counts.completed == 4 and len(batch_runs) == 4

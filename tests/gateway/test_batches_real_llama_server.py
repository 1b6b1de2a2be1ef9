"""/v1/batches through the official `openai` SDK, the gateway and its `BatchRunner` to a real llama-server (Gemma 3
270M, the run's shared engine: tests/support/shared_engines.py): a batch of 20 chat requests completes with 20 output
lines, one per custom_id in input order, a malformed line an error line of its own; its usage rows name the batch,
are billed at the batch price and count toward the daily tokens but not the per-minute requests; a cancel keeps the
finished lines.

Gemma 270M is a base model: the tests assert shapes, counts and ids, not wording. Time: about 10 s on 2 cores.
"""

from __future__ import annotations

import json
from dataclasses import replace

import openai
import pytest
import trio
from gateway_harness import ProjectPolicy, make_table, replica, start_gateway
from shared_engines import ENGINES

from llmgw.cli.keys_cmds import request_json
from llmgw.gateway.batch_runner import BatchRunner
from llmgw.routes import Quota

pytestmark = pytest.mark.slow
KEY = ENGINES["shared_gemma"].key
MODEL = ENGINES["shared_gemma"].served_name
CHAT = "/v1/chat/completions"
DAILY = 10_000_000
SCOPES = (("project:chat", Quota(requests_per_minute=1, tokens_per_day=DAILY)),)


@pytest.fixture
def engine(shared_gemma) -> str:
    """The run's shared Gemma llama-server (one thread: with two, its requests took 1-7 s each instead of 0.3 s while
    other tests loaded this machine's two cores); its base URL."""
    return shared_gemma.base_url


async def _gateway(nursery, store, url: str):
    table = make_table({MODEL: [replica("r-0", url, replica_key=KEY)]},
                       projects={"chat": ProjectPolicy("chat", "t", "o", quotas=SCOPES)})
    table = replace(table, models={MODEL: replace(table.models[MODEL], prompt_price_per_million=2.0,
                                                   completion_price_per_million=4.0,
                                                   batch_prompt_price_per_million=1.0,
                                                   batch_completion_price_per_million=2.0)})
    gateway, base = await start_gateway(nursery, store, table)
    await nursery.start(BatchRunner(gateway, "cp-test", poll=0.2).run)
    return gateway, openai.AsyncOpenAI(base_url=base, api_key=store.create_api_key("chat")[1], max_retries=0)


def _request(custom_id: str, words: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": {
        "model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 2, "temperature": 0}})


async def _until(sdk, batch_id: str, done, seconds: float = 60.0):
    """The batch once `done(batch)` is true; fails after `seconds`, naming where the batch stood."""
    batch = None
    with trio.move_on_after(seconds):
        while not done(batch := await sdk.batches.retrieve(batch_id)):
            await trio.sleep(0.1)
        return batch
    raise AssertionError(f"the batch did not get there in {seconds} s: {batch}")


def _lines(data: bytes) -> list[dict]:
    return [json.loads(row) for row in data.decode().splitlines()]


async def test_a_batch_of_20_completes_with_a_line_per_custom_id_and_a_malformed_line_in_the_error_file(
        nursery, store, engine):
    _gw, sdk = await _gateway(nursery, store, engine)
    rows = [_request(f"req-{i:02d}", f"Count to {i}.") for i in range(20)]
    rows.insert(7, '{"custom_id": "broken", "method": "POST", "url": "/v1/chat/completions", "body": ')
    upload = await sdk.files.create(file=("requests.jsonl", "\n".join(rows).encode()), purpose="batch")
    batch = await sdk.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h",
                                     metadata={"job": "nightly"})
    assert batch.status == "in_progress" and batch.request_counts.total == 21 and batch.model == MODEL
    done = await _until(sdk, batch.id, lambda b: b.status == "completed")
    assert (done.request_counts.completed, done.request_counts.failed) == (20, 1)
    assert done.metadata == {"job": "nightly"} and done.completed_at >= done.in_progress_at
    output = _lines((await sdk.files.content(done.output_file_id)).content)
    assert [line["custom_id"] for line in output] == [f"req-{i:02d}" for i in range(20)]
    assert {line["response"]["status_code"] for line in output} == {200}
    assert all(line["response"]["body"]["object"] == "chat.completion" for line in output)
    errors = _lines((await sdk.files.content(done.error_file_id)).content)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [(None, "invalid_json_line")]
    assert (await sdk.files.retrieve(done.output_file_id)).purpose == "batch_output"
    with pytest.raises(openai.ConflictError):
        await sdk.batches.cancel(done.id)
    records = [r for r in store.recent_usage(limit=100) if r.batch_id == batch.id]
    assert len(records) == 20 and all(r.status == 200 and r.replica == "r-0" for r in records)
    first_line = output[0]["response"]["request_id"]  # the gateway's id of the line's request: `llmgw usage --request`
    assert request_json(first_line, store.usage_of_request(first_line))["batch_id"] == batch.id
    assert sum(r.prompt_tokens for r in records) == done.usage.input_tokens
    assert all(r.cost == pytest.approx((r.prompt_tokens * 1.0 + r.completion_tokens * 2.0) / 1e6) for r in records)
    # the daily tokens count them; the per-minute requests (1) do not: an interactive request is still admitted
    tokens = store.headroom([("project:chat", Quota(tokens_per_day=DAILY))]).tokens
    assert tokens.remaining == DAILY - sum(r.prompt_tokens + r.completion_tokens for r in records)
    answer = await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=2)
    assert answer.choices and store.recent_usage(limit=1)[0].batch_id is None


async def test_a_cancel_stops_the_batch_and_keeps_the_finished_lines(nursery, store, engine):
    _gw, sdk = await _gateway(nursery, store, engine)
    rows = [_request(f"c-{i:02d}", f"Say {i}.") for i in range(20)]
    upload = await sdk.files.create(file=("requests.jsonl", "\n".join(rows).encode()), purpose="batch")
    batch = await sdk.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    await _until(sdk, batch.id, lambda b: b.request_counts.completed >= 2)
    cancelling = await sdk.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = await _until(sdk, batch.id, lambda b: b.status == "cancelled")
    assert 2 <= done.request_counts.completed < 20 and done.cancelled_at is not None
    output = _lines((await sdk.files.content(done.output_file_id)).content)
    ids = [line["custom_id"] for line in output]
    assert ids == [f"c-{i:02d}" for i in range(len(ids))] and len(ids) == done.request_counts.completed
    await trio.sleep(0.5)  # nothing runs after the cancel
    assert len([r for r in store.recent_usage(limit=100) if r.batch_id == batch.id]) == len(ids)
    assert (await sdk.batches.cancel(batch.id)).status == "cancelled"  # again: as it is


async def test_a_runner_stopped_mid_batch_is_resumed_by_another_and_no_line_is_answered_twice_or_lost(
        nursery, store, engine):
    table = make_table({MODEL: [replica("r-0", engine, replica_key=KEY)]})
    gateway, base = await start_gateway(nursery, store, table)
    sdk = openai.AsyncOpenAI(base_url=base, api_key=store.create_api_key("chat")[1], max_retries=0)
    first = trio.CancelScope()

    async def run_first() -> None:
        with first:  # cancelled mid-line, like a control plane killed: its running line stays claimed
            await BatchRunner(gateway, "cp-killed", poll=0.2).run()

    nursery.start_soon(run_first)
    rows = [_request(f"r-{i:02d}", f"Name {i}.") for i in range(20)]
    upload = await sdk.files.create(file=("requests.jsonl", "\n".join(rows).encode()), purpose="batch")
    batch = await sdk.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    await _until(sdk, batch.id, lambda b: b.request_counts.completed >= 5)
    first.cancel()
    await trio.sleep(0.3)
    stopped = await sdk.batches.retrieve(batch.id)
    assert stopped.status == "in_progress" and stopped.request_counts.completed < 20
    await nursery.start(BatchRunner(gateway, "cp-next", poll=0.2).run)
    done = await _until(sdk, batch.id, lambda b: b.status == "completed")
    assert (done.request_counts.completed, done.request_counts.failed) == (20, 0)
    output = _lines((await sdk.files.content(done.output_file_id)).content)
    assert [line["custom_id"] for line in output] == [f"r-{i:02d}" for i in range(20)]
    records = [r for r in store.recent_usage(limit=200) if r.batch_id == batch.id]
    answered = sorted(r.client_request_id or "" for r in records if r.status == 200)
    assert len(answered) == 20  # each line answered once: the interrupted one ran again, none twice
    assert [r.status for r in records if r.status != 200] in ([], [499])  # the line cut by the stop, billed


async def test_a_responses_batch_answers_response_objects_and_refuses_a_previous_response_id(nursery, store, engine):
    _gw, sdk = await _gateway(nursery, store, engine)
    rows = [json.dumps({"custom_id": "plain", "method": "POST", "url": "/v1/responses", "body": {
                "model": MODEL, "input": "Name a colour.", "max_output_tokens": 16, "temperature": 0}}),
            json.dumps({"custom_id": "chained", "method": "POST", "url": "/v1/responses", "body": {
                "model": MODEL, "input": "And another?", "previous_response_id": "resp_" + "0" * 32,
                "max_output_tokens": 16}})]
    upload = await sdk.files.create(file=("responses.jsonl", "\n".join(rows).encode()), purpose="batch")
    batch = await sdk.batches.create(input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h")
    done = await _until(sdk, batch.id, lambda b: b.status == "completed")
    [answered] = _lines((await sdk.files.content(done.output_file_id)).content)
    assert answered["custom_id"] == "plain" and answered["response"]["body"]["object"] == "response"
    assert answered["response"]["body"]["usage"]["output_tokens"] > 0
    [refused] = _lines((await sdk.files.content(done.error_file_id)).content)
    assert refused["response"]["status_code"] == 400
    assert refused["response"]["body"]["error"]["param"] == "previous_response_id"
    assert done.usage.output_tokens == answered["response"]["body"]["usage"]["output_tokens"]

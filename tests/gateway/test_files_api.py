"""/v1/files and the refusals of /v1/batches through the official `openai` SDK and a real gateway (SQLite store, no
engine needed): upload, list, retrieve, content and delete, for the owning project only; an upload over the limit is
a 413 (refused from its Content-Length, or once read); a batch of a file without requests fails with a sentence; a batch
past its completion window expires, its unrun lines error lines (batch_expired)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import openai
import pytest
import trio
from gateway_harness import ProjectPolicy, make_table, start_gateway

from llmgw.gateway.batch_lines import read_lines
from llmgw.gateway.batch_runner import BatchRunner
from llmgw.store import BatchRecord

LIMIT = 4096


async def _clients(nursery, store):
    table = replace(make_table({}, projects={name: ProjectPolicy(name, "t", "o") for name in ("chat", "other")}),
                    max_file_bytes=LIMIT)
    gateway, base = await start_gateway(nursery, store, table)
    return gateway, *[openai.AsyncOpenAI(base_url=base, api_key=store.create_api_key(project)[1], max_retries=0)
                      for project in ("chat", "other")]


async def test_a_file_is_uploaded_listed_read_and_deleted_by_its_project_only(nursery, store):
    _gateway, sdk, other = await _clients(nursery, store)
    data = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "h\xc3\xa9"}}\n'
    made = await sdk.files.create(file=("requests.jsonl", data), purpose="batch")
    second = await sdk.files.create(file=("more.jsonl", b"{}\n"), purpose="batch")
    assert made.id.startswith("file-") and made.bytes == len(data) and made.filename == "requests.jsonl"
    assert made.purpose == "batch" and made.object == "file" and made.status == "processed"
    assert made.expires_at - made.created_at == 30 * 86400  # store.files_retention's default
    assert (await sdk.files.retrieve(made.id)).bytes == len(data)
    assert (await sdk.files.content(made.id)).content == data
    assert [f.id for f in (await sdk.files.list()).data] == [second.id, made.id]
    assert [f.id for f in (await sdk.files.list(order="asc", limit=1)).data] == [made.id]
    assert (await other.files.list()).data == []
    with pytest.raises(openai.NotFoundError):
        await other.files.content(made.id)
    with pytest.raises(openai.NotFoundError):
        await other.files.delete(made.id)
    deleted = await sdk.files.delete(made.id)
    assert deleted.deleted is True and deleted.id == made.id
    with pytest.raises(openai.NotFoundError):
        await sdk.files.retrieve(made.id)


@pytest.mark.parametrize("size", [LIMIT + 1, LIMIT + 200 * 1024])
async def test_a_file_over_the_limit_is_a_413_and_nothing_is_kept(nursery, store, size):
    _gateway, sdk, _other = await _clients(nursery, store)
    with pytest.raises(openai.APIStatusError) as refused:
        await sdk.files.create(file=("big.jsonl", b"x" * size), purpose="batch")
    assert refused.value.status_code == 413 and "limits.max_file_size" in refused.value.message
    assert (await sdk.files.list()).data == []


async def test_wrong_purposes_files_and_batch_fields_are_400s_naming_the_field(nursery, store):
    _gateway, sdk, other = await _clients(nursery, store)
    with pytest.raises(openai.BadRequestError, match="purpose"):
        await sdk.files.create(file=("a.jsonl", b"{}\n"), purpose="fine-tune")
    made = await sdk.files.create(file=("a.jsonl", b"{}\n"), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="input_file_id|purpose 'batch'"):
        await other.batches.create(input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        await sdk.batches.create(input_file_id=made.id, endpoint="/v1/moderations", completion_window="24h")
    empty = await sdk.files.create(file=("empty.jsonl", b"\n\n"), purpose="batch")
    failed = await sdk.batches.create(input_file_id=empty.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
    assert failed.status == "failed" and "no request lines" in failed.errors.data[0].message
    assert (await sdk.batches.retrieve(failed.id)).status == "failed"
    assert [b.id for b in (await sdk.batches.list()).data] == [failed.id]
    with pytest.raises(openai.NotFoundError):
        await other.batches.retrieve(failed.id)


async def test_a_batch_past_its_completion_window_expires_with_its_unrun_lines_as_error_lines(nursery, store):
    gateway, sdk, _other = await _clients(nursery, store)
    rows = "\n".join(f'{{"custom_id": "e-{i}", "method": "POST", "url": "/v1/embeddings", "body": {{"input": "x"}}}}'
                     for i in range(3)) + "\nnot json"
    now = time.time()
    store.create_batch(BatchRecord("batch_late", "chat", "key_1", "in_progress", now - 90000, now + 3600, {
        "endpoint": "/v1/embeddings", "input_file_id": "file-x", "expires_at": int(now - 3600)}),
        read_lines(rows.encode(), "/v1/embeddings"))
    await nursery.start(BatchRunner(gateway, "cp-test", poll=0.1).run)
    with trio.fail_after(10):
        while (batch := await sdk.batches.retrieve("batch_late")).status != "expired":
            await trio.sleep(0.05)
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (4, 0, 4)
    assert batch.expired_at is not None and batch.output_file_id is None
    errors = [json.loads(row) for row in (await sdk.files.content(batch.error_file_id)).text.splitlines()]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        ("e-0", "batch_expired"), ("e-1", "batch_expired"), ("e-2", "batch_expired"), (None, "invalid_json_line")]

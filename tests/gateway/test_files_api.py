"""/v1/files and the refusals of /v1/batches through the official `openai` SDK and a real gateway (SQLite store, no
engine needed): upload, list, retrieve, content and delete, for the owning project only; an upload over the limit is
a 413 (refused from its Content-Length, or once read); a batch of a file without requests fails with a sentence."""

from __future__ import annotations

from dataclasses import replace

import openai
import pytest
from gateway_harness import ProjectPolicy, make_table, start_gateway

LIMIT = 4096


async def _clients(nursery, store):
    table = replace(make_table({}, projects={name: ProjectPolicy(name, "t", "o") for name in ("chat", "other")}),
                    max_file_bytes=LIMIT)
    _gateway, base = await start_gateway(nursery, store, table)
    return [openai.AsyncOpenAI(base_url=base, api_key=store.create_api_key(project)[1], max_retries=0)
            for project in ("chat", "other")]


async def test_a_file_is_uploaded_listed_read_and_deleted_by_its_project_only(nursery, store):
    sdk, other = await _clients(nursery, store)
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
    sdk, _other = await _clients(nursery, store)
    with pytest.raises(openai.APIStatusError) as refused:
        await sdk.files.create(file=("big.jsonl", b"x" * size), purpose="batch")
    assert refused.value.status_code == 413 and "limits.max_file_size" in refused.value.message
    assert (await sdk.files.list()).data == []


async def test_wrong_purposes_files_and_batch_fields_are_400s_naming_the_field(nursery, store):
    sdk, other = await _clients(nursery, store)
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

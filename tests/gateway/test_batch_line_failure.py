"""A batch line that fails inside the gateway with an unexpected exception (a bug, not an ApiError) fails that line
alone: its batch completes with the other lines, the error file holds a 500 `internal_error` for it, and the runner
goes on to the next batch. Before, the exception ended the runner's nursery and with it every batch. One llama-server
stand-in; about 2 s."""

from __future__ import annotations

import json

import openai
import trio
from gateway_harness import ENGINE_KEY, FakeLlamaServer, make_table, replica, start_gateway

from llmgw.gateway.batch_runner import BatchRunner


async def _batch(sdk, prompts: list[str]):
    rows = [json.dumps({"custom_id": f"c-{i}", "method": "POST", "url": "/v1/completions",
                        "body": {"model": "tiny", "prompt": prompt, "max_tokens": 4}}) for i, prompt in enumerate(prompts)]
    upload = await sdk.files.create(file=("in.jsonl", "\n".join(rows).encode()), purpose="batch")
    return await sdk.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")


async def _done(sdk, batch_id: str):
    with trio.fail_after(20):
        while (batch := await sdk.batches.retrieve(batch_id)).status != "completed":
            await trio.sleep(0.05)
    return batch


async def test_a_line_that_raises_fails_alone_and_the_runner_goes_on(nursery, store):
    engine = FakeLlamaServer("/models/gemma.gguf", alias="tiny", api_key=ENGINE_KEY)
    port = await nursery.start(engine.serve, "127.0.0.1", 0)
    gateway, base = await start_gateway(nursery, store, make_table({"tiny": [replica("r-0", f"http://127.0.0.1:{port}")]}))
    admit = gateway.admission.admit

    async def admit_or_raise(caller, table, endpoint, body, raw):
        if body.get("prompt") == "broken":
            raise RuntimeError("a bug in the gateway")
        return await admit(caller, table, endpoint, body, raw)

    gateway.admission.admit = admit_or_raise
    sdk = openai.AsyncOpenAI(base_url=base, api_key=store.create_api_key("chat")[1], max_retries=0)
    first = await _batch(sdk, ["line 0", "broken", "line 2"])
    await nursery.start(BatchRunner(gateway, "cp", poll=0.2).run)

    done = await _done(sdk, first.id)
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    errors = [json.loads(row) for row in (await sdk.files.content(done.error_file_id)).text.splitlines()]
    assert [(e["custom_id"], e["response"]["status_code"], e["response"]["body"]["error"]["code"]) for e in errors] == [
        ("c-1", 500, "internal_error")]
    second = await _done(sdk, (await _batch(sdk, ["again"])).id)  # the same runner takes the next batch
    assert (second.request_counts.completed, second.request_counts.failed) == (1, 0)

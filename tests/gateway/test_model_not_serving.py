"""A model its catalog file sets to `replicas: 0` (the example's gemma-3-270m-vllm, listed by /v1/models) will not
become ready: the gateway said "No replica ... is ready yet; retry in a few seconds" with Retry-After, so clients and
the SDK's own retries looped (a fresh-user trial). It now answers 503 `model_not_serving`, naming the setting and
what to do, without Retry-After and with `x-should-retry: false`, which the openai SDK obeys: one request, no retry.
A model that is only not ready yet keeps `model_not_ready` with Retry-After."""

from __future__ import annotations

from dataclasses import replace

import httpx
import openai
import pytest
from gateway_harness import make_table, start_gateway

from llmgw.control.routing import build_route_table
from llmgw.gateway.feed import table_from_json, table_to_json
from llmgw.plan import Fleet
from llmgw.routes import ModelRoute
from llmgw.settings import load_directory
from llmgw.settings.packaged import example_dir


def test_the_examples_model_at_replicas_0_is_off_and_the_served_one_is_not():
    table = build_route_table(load_directory(example_dir()), Fleet(nodes=()), lambda rid: "k")
    assert table.models["gemma-3-270m-vllm"].off and not table.models["gemma-3-270m"].off
    assert table_from_json(table_to_json(table)).models["gemma-3-270m-vllm"].off  # the workers' feed keeps it


async def test_a_model_set_to_no_replica_is_refused_once_without_retry_and_one_not_ready_yet_says_retry(nursery,
                                                                                                       store):
    table = make_table({"waiting": []})
    table = replace(table, models={**table.models,
                                   "stopped-model": ModelRoute(name="stopped-model", off=True, created=1700000000)})
    gateway, base = await start_gateway(nursery, store, table)
    sent = []

    async def count(request: httpx.Request) -> None:
        sent.append(request.url.path)

    http = httpx.AsyncClient(event_hooks={"request": [count]})
    sdk = openai.AsyncOpenAI(base_url=base, api_key=store.create_api_key("chat")[1], http_client=http, max_retries=2)

    with pytest.raises(openai.APIStatusError) as refused:
        await sdk.completions.create(model="stopped-model", prompt="hi", max_tokens=2)
    assert refused.value.status_code == 503 and refused.value.body["code"] == "model_not_serving"
    assert "replicas: 0" in refused.value.message and "llmgw model replicas stopped-model 1" in refused.value.message
    assert "retry-after" not in refused.value.response.headers and len(sent) == 1  # the SDK did not retry

    with pytest.raises(openai.APIStatusError) as waiting:
        await sdk.with_options(max_retries=0).completions.create(model="waiting", prompt="hi", max_tokens=2)
    assert waiting.value.body["code"] == "model_not_ready" and waiting.value.response.headers["retry-after"]

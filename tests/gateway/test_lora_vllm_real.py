"""A PEFT LoRA adapter on the real vLLM 0.32 (the one `vllm_server` starts per test run with `--enable-lora
--lora-modules`, the adapter made in its set-up: seeded random, rank 4, written with safetensors and numpy) through
the gateway with the official openai SDK: the routing table is the control plane's (`build_route_table`, the
adapter in the catalog), the adapter's name goes to vLLM as `model`, its greedy output differs from the base model's,
it is billed under its own name; and vLLM's KV events show how it hashes an adapter's blocks (its name and path),
which is why adapters are routed by the approximate policy."""

from __future__ import annotations

import uuid
from types import MappingProxyType

import httpx
import openai
import pytest
import trio
from gateway_harness import start_gateway
from vllm_harness import ADAPTER, BLOCK_SIZE, ENGINE_KEY, SERVED

from llmgw.control.routing import build_route_table
from llmgw.engines import vllm as vllm_engine
from llmgw.engines.vllm_kv_listener import KvEventListener
from llmgw.plan.identity import fingerprint
from llmgw.plan.types import Fleet, NodeState, ObservedShard, ShardState
from llmgw.settings.model import (
    Adapter, ClusterSettings, EngineVersion, Model, Organisation, Prices, Project, Settings, Team, WeightsFile,
)
from llmgw.tools.vllm_hashing import block_hashes

pytestmark = pytest.mark.slow
PROMPT = "The old lighthouse on the hill"


def catalog_table(served):
    """The control plane's routing table for a catalog holding the model with the adapter vLLM was started with,
    its one replica ready on the running vLLM."""
    adapter = Adapter(ADAPTER, tuple(WeightsFile(f"file://{served.adapter_dir / name}", sha)
                                     for name, sha in served.adapter_files.items()))
    model = Model(name=SERVED, engine="vllm", weights=(WeightsFile("file:///converted/model.safetensors", "a" * 64),),
                  prices=Prices(1.0, 2.0), adapters=(adapter,))
    settings = Settings(
        cluster=ClusterSettings(name="t"), models=MappingProxyType({SERVED: model}),
        engines=MappingProxyType({("vllm", "0.32.0"): EngineVersion("vllm", "0.32.0", default=True)}),
        organisations=MappingProxyType({"acme": Organisation("acme")}),
        teams=MappingProxyType({"research": Team("research", "acme")}),
        projects=MappingProxyType({"lora": Project("lora", "research", "acme", models=(ADAPTER,)),
                                   "all": Project("all", "research", "acme")}))
    port = int(served.url.rsplit(":", 1)[1])
    shard = ObservedShard(f"{SERVED}-0/0", f"{SERVED}-0", SERVED, ShardState.READY, port=port,
                          fingerprint=fingerprint(model, "0.32.0"))
    return build_route_table(settings, Fleet(nodes=(NodeState("n1", address="127.0.0.1", shards=(shard,)),)),
                             lambda rid: ENGINE_KEY)


@pytest.fixture
async def world(nursery, store, vllm_server):
    gateway, base = await start_gateway(nursery, store, catalog_table(vllm_server))

    def client(project: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=base, api_key=store.create_api_key(project)[1], max_retries=0)

    return gateway, client


async def greedy(sdk: openai.AsyncOpenAI, model: str) -> str:
    answer = await sdk.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    assert answer.usage.completion_tokens == 12 and answer.model == model
    return answer.choices[0].text


async def test_the_peft_adapter_changes_greedy_output_and_is_billed_under_its_name(world, store):
    _gateway, client = world
    anyone = client("all")
    assert {m.id: getattr(m, "parent", None) async for m in anyone.models.list()} == {SERVED: None, ADAPTER: SERVED}
    base, adapted = await greedy(anyone, SERVED), await greedy(anyone, ADAPTER)
    print(f"\nbase:    {base!r}\nadapter: {adapted!r}")
    assert adapted != base
    assert [await greedy(anyone, m) for m in (ADAPTER, SERVED)] == [adapted, base]  # deterministic, no leak

    # streamed chat under the adapter's name, with usage
    chunks = [c async for c in await anyone.chat.completions.create(
        model=ADAPTER, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=6, temperature=0,
        stream=True, stream_options={"include_usage": True})]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert {c.model for c in chunks} == {ADAPTER}

    only = client("lora")
    assert await greedy(only, ADAPTER) == adapted
    with pytest.raises(openai.PermissionDeniedError):
        await greedy(only, SERVED)
    records = store.recent_usage(project="lora")
    assert [(r.model, r.status) for r in records] == [(SERVED, 403), (ADAPTER, 200)]
    assert records[1].cost == pytest.approx((records[1].prompt_tokens * 1.0 + 12 * 2.0) / 1e6)
    assert [r.model for r in store.recent_usage(project="all")].count(ADAPTER) == 3


async def test_vllm_hashes_an_adapters_blocks_with_its_name_and_path(world, nursery, vllm_server):
    """Why requests for an adapter are not routed precisely: vLLM 0.32 keeps an adapter's prefix-cache blocks
    apart by hashing each with ("lora", name, path) as extra keys, the path being the adapter's directory on the node
    (which the gateway does not know). Checked here against vLLM's own KV events."""
    _gateway, client = world
    listener = KvEventListener(port=vllm_server.kv_port)
    await nursery.start(listener.run)
    anyone = client("all")
    prompt = f"{uuid.uuid4()} " + "A lighthouse keeper counts the waves every night. " * 30  # fresh, > 2 blocks
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ENGINE_KEY}"}, timeout=120) as engine:
        with trio.fail_after(90):  # vLLM reconnects to a newly bound listener within seconds
            while listener.messages == 0:
                await anyone.completions.create(model=SERVED, prompt=f"{uuid.uuid4()} " + "warm up " * 150,
                                                max_tokens=1)
                await trio.sleep(1)
        tokens = (await engine.post(vllm_server.url + "/tokenize", json={"model": ADAPTER, "prompt": prompt})).json()
    await anyone.completions.create(model=ADAPTER, prompt=prompt, max_tokens=1, temperature=0)
    count = len(tokens["tokens"]) // BLOCK_SIZE
    keys = [(("lora", ADAPTER, str(vllm_server.adapter_dir)),)] * count
    adapted = block_hashes(tokens["tokens"], BLOCK_SIZE, seed=vllm_engine.HASH_SEED, extra_keys=keys)
    plain = block_hashes(tokens["tokens"], BLOCK_SIZE, seed=vllm_engine.HASH_SEED)
    assert count >= 2
    with trio.fail_after(30):
        while not set(adapted) <= listener.blocks.held():
            await listener.changed.wait()
    assert not set(plain) & listener.blocks.held()
    assert listener.malformed == 0

"""A client names a LoRA adapter as `model` (official openai SDK, real HTTP): the gateway lists it, allows it per
project by its own name, sends it to its model's replica told as the engine wants it (llama.cpp: the `lora` field;
vLLM: the adapter's name as `model`), and bills it under its own name. Engines are stand-ins that record what they
were sent and answer a real vLLM capture; the routing table is the control plane's (`build_route_table`)."""

from __future__ import annotations

from types import MappingProxyType

import openai
import pytest
from gateway_harness import ReplayEngine, start_gateway, start_replay, vllm_capture

from llmgw.control.routing import build_route_table
from llmgw.plan.identity import fingerprint
from llmgw.plan.types import Fleet, NodeState, ObservedShard, ShardState
from llmgw.settings.model import (
    Adapter, ClusterSettings, EngineVersion, Model, Organisation, Prices, Project, Settings, Team, WeightsFile,
)

FILE = WeightsFile("file:///w/x", "a" * 64)
GEMMA = Model(name="gemma", engine="llama.cpp", weights=(FILE,), aliases=("g",), prices=Prices(1.0, 2.0),
              adapters=(Adapter("gemma-pirate", (FILE,)), Adapter("gemma-poet", (FILE,))))
QWEN = Model(name="qwen", engine="vllm", weights=(FILE,), adapters=(Adapter("qwen-sql", (FILE,)),))


def table_for(ports: dict[str, int]):
    settings = Settings(
        cluster=ClusterSettings(name="t"),
        models=MappingProxyType({"gemma": GEMMA, "qwen": QWEN}),
        engines=MappingProxyType({("llama.cpp", "b1"): EngineVersion("llama.cpp", "b1", default=True),
                                  ("vllm", "0.32.0"): EngineVersion("vllm", "0.32.0", default=True)}),
        organisations=MappingProxyType({"acme": Organisation("acme")}),
        teams=MappingProxyType({"research": Team("research", "acme")}),
        projects=MappingProxyType({"pirates": Project("pirates", "research", "acme", models=("gemma-pirate",)),
                                   "all": Project("all", "research", "acme")}),
    )
    shards = (ObservedShard("gemma-0/0", "gemma-0", "gemma", ShardState.READY, port=ports["gemma"],
                            fingerprint=fingerprint(GEMMA, "b1")),
              ObservedShard("qwen-0/0", "qwen-0", "qwen", ShardState.READY, port=ports["qwen"],
                            fingerprint=fingerprint(QWEN, "0.32.0")))
    fleet = Fleet(nodes=(NodeState("n1", address="127.0.0.1", shards=shards),))
    return build_route_table(settings, fleet, lambda rid: "engine-key")


@pytest.fixture
async def world(nursery, store):
    engines = {name: ReplayEngine(200, vllm_capture("completion_0.json")) for name in ("gemma", "qwen")}
    ports = {name: int((await start_replay(nursery, engine)).rsplit(":", 1)[1]) for name, engine in engines.items()}
    _gateway, base = await start_gateway(nursery, store, table_for(ports))

    def client(project: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=base, api_key=store.create_api_key(project)[1], max_retries=0)

    return engines, client


async def test_adapters_are_listed_with_their_model_and_only_to_projects_allowed_them(world):
    _engines, client = world
    everything = {m.id: getattr(m, "parent", None) async for m in client("all").models.list()}
    assert everything == {"gemma": None, "g": None, "gemma-pirate": "gemma", "gemma-poet": "gemma", "qwen": None,
                          "qwen-sql": "qwen"}
    assert [m.id async for m in client("pirates").models.list()] == ["gemma-pirate"]


async def test_a_llama_cpp_adapter_is_applied_by_its_position_and_billed_under_its_name(world, store):
    engines, client = world
    pirates = client("pirates")
    answer = await pirates.completions.create(model="gemma-pirate", prompt="Ahoy", max_tokens=8)
    assert answer.model == "gemma-pirate" and answer.usage.completion_tokens == 8
    sent = engines["gemma"].bodies[-1]
    assert (sent["model"], sent["lora"]) == ("gemma-pirate", [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}])
    with pytest.raises(openai.PermissionDeniedError, match="may not use the model 'gemma'"):
        await pirates.completions.create(model="gemma", prompt="Ahoy", max_tokens=8)
    with pytest.raises(openai.PermissionDeniedError, match="may not use the model 'gemma-poet'"):
        await pirates.completions.create(model="gemma-poet", prompt="Ahoy", max_tokens=8)
    records = store.recent_usage(project="pirates")
    assert [(r.model, r.status) for r in records] == [("gemma-poet", 403), ("gemma", 403), ("gemma-pirate", 200)]
    assert records[-1].cost == pytest.approx((367 * 1.0 + 8 * 2.0) / 1e6)  # the model's prices


async def test_the_second_adapter_gets_id_one_and_the_models_own_name_applies_none_whatever_the_client_sent(world):
    engines, client = world
    anyone = client("all")
    await anyone.completions.create(model="gemma-poet", prompt="Roses", max_tokens=8)
    assert engines["gemma"].bodies[-1]["lora"] == [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1.0}]
    await anyone.completions.create(model="g", prompt="Roses", max_tokens=8,
                                    extra_body={"lora": [{"id": 1, "scale": 1.0}]})
    sent = engines["gemma"].bodies[-1]
    # not the poet, which this name does not pay for
    assert (sent["model"], sent["lora"]) == ("gemma", [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}])


async def test_a_vllm_adapter_is_sent_by_name_and_billed_under_it(world, store):
    engines, client = world
    anyone = client("all")
    await anyone.completions.create(model="qwen-sql", prompt="SELECT", max_tokens=8)
    sent = engines["qwen"].bodies[-1]
    assert sent["model"] == "qwen-sql" and "lora" not in sent
    assert [r.model for r in store.recent_usage(project="all")] == ["qwen-sql"]


"""LoRA adapters in the gateway's routing table: each is a name of its own, served by its model's replicas that run
the settings' generation, priced as its model, allowed per project on its own, and told to the engine as the engine
wants it (llama.cpp: the `lora` field by position; vLLM: the adapter's name as `model`)."""

from __future__ import annotations

from types import MappingProxyType

from llmgw.control.routing import build_route_table
from llmgw.plan.identity import fingerprint
from llmgw.plan.types import Fleet, NodeState, ObservedShard, ShardState
from llmgw.settings.model import (
    Adapter, ClusterSettings, EngineVersion, Model, Organisation, Prices, Project, Settings, Team, WeightsFile,
)

GGUF = WeightsFile("file:///w/base.gguf", "a" * 64)


def lora(name: str) -> Adapter:
    return Adapter(name, (WeightsFile(f"file:///w/{name}.gguf", "b" * 64),))


GEMMA = Model(name="gemma", engine="llama.cpp", weights=(GGUF,), aliases=("g",), prices=Prices(0.1, 0.2),
              adapters=(lora("gemma-pirate"), lora("gemma-poet")))
QWEN = Model(name="qwen", engine="vllm", weights=(GGUF,), adapters=(lora("qwen-sql"),))
PLAIN = Model(name="plain", engine="llama.cpp", weights=(GGUF,))


def settings() -> Settings:
    return Settings(
        cluster=ClusterSettings(name="t"),
        models=MappingProxyType({m.name: m for m in (GEMMA, QWEN, PLAIN)}),
        engines=MappingProxyType({("llama.cpp", "b1"): EngineVersion("llama.cpp", "b1", default=True),
                                  ("vllm", "0.32.0"): EngineVersion("vllm", "0.32.0", default=True)}),
        organisations=MappingProxyType({"acme": Organisation("acme")}),
        teams=MappingProxyType({"research": Team("research", "acme")}),
        projects=MappingProxyType({
            "pirates": Project("pirates", "research", "acme", models=("gemma-pirate",)),
            "base": Project("base", "research", "acme", models=("g",)),
            "all": Project("all", "research", "acme"),
        }),
    )


def shard(replica: str, port: int, fp: str, state: ShardState = ShardState.READY) -> ObservedShard:
    return ObservedShard(f"{replica}/0", replica, replica.rsplit("-", 1)[0], state, port=port, fingerprint=fp)


def table(*shards: ObservedShard):
    fleet = Fleet(nodes=(NodeState("n1", address="10.0.0.1", shards=shards),))
    return build_route_table(settings(), fleet, lambda rid: f"key-{rid}")


CURRENT = {m.name: fingerprint(m, version) for m, version in ((GEMMA, "b1"), (QWEN, "0.32.0"), (PLAIN, "b1"))}


def test_each_adapter_is_a_route_of_its_own_on_its_models_replicas_at_its_models_prices():
    routes = table(shard("gemma-0", 9001, CURRENT["gemma"]), shard("gemma-1", 9002, CURRENT["gemma"])).models
    pirate = routes["gemma-pirate"]
    assert pirate.adapter_of == "gemma" and pirate.aliases == ()
    assert [r.replica_id for r in pirate.replicas] == ["gemma-0", "gemma-1"] == \
        [r.replica_id for r in routes["gemma"].replicas]
    assert pirate.replicas[0].replica_key == "key-gemma-0"
    assert (pirate.prompt_price_per_million, pirate.completion_price_per_million) == (0.1, 0.2)
    assert routes["gemma"].adapter_of is None


def test_llama_cpp_is_told_the_adapters_position_and_the_base_name_applies_none():
    routes = table(shard("gemma-0", 9001, CURRENT["gemma"])).models
    assert dict(routes["gemma-pirate"].body_fields) == {"lora": [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.0}]}
    assert dict(routes["gemma-poet"].body_fields) == {"lora": [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 1.0}]}
    # a client's own `lora` cannot reach an adapter through the model's name
    assert dict(routes["gemma"].body_fields) == {"lora": [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]}
    assert dict(routes["plain"].body_fields) == {}  # no adapters: the body passes as the client wrote it


def test_vllm_adapters_need_no_extra_field_the_name_is_the_model():
    routes = table(shard("qwen-0", 9003, CURRENT["qwen"])).models
    assert dict(routes["qwen-sql"].body_fields) == {} and dict(routes["qwen"].body_fields) == {}
    assert [r.replica_id for r in routes["qwen-sql"].replicas] == ["qwen-0"]


def test_a_replica_still_running_an_older_generation_serves_its_model_but_not_the_adapters():
    routes = table(shard("gemma-0", 9001, "an-older-fingerprint"), shard("gemma-1", 9002, CURRENT["gemma"]),
                   shard("gemma-2", 9004, CURRENT["gemma"], ShardState.STARTING)).models
    assert [r.replica_id for r in routes["gemma"].replicas] == ["gemma-0", "gemma-1"]
    assert [r.replica_id for r in routes["gemma-pirate"].replicas] == ["gemma-1"]


def test_projects_allow_adapters_by_their_own_names_only():
    projects = table().projects
    assert projects["pirates"].models == frozenset({"gemma-pirate"})  # not the base model
    assert projects["base"].models == frozenset({"gemma"})  # not its adapters
    assert projects["all"].models is None


def test_a_client_may_name_an_adapter_and_nothing_resolves_to_it_by_alias():
    routing = table(shard("gemma-0", 9001, CURRENT["gemma"]))
    assert routing.resolve("gemma-poet").adapter_of == "gemma"
    assert routing.resolve("g").name == "gemma"

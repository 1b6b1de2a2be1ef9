"""LoRA adapters' files: fetched by the agent with the model's weights (the same cache, checks and progress), and
given to the engine as it loads them (llama.cpp: the adapter's GGUF; vLLM: the PEFT directory, with its rank)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import trio

from llmgw.agent.weights import fetch
from llmgw.agent.weights_layout import lay_out_adapters, peft_rank
from llmgw.errors import WeightsError
from llmgw.wire import control_message, pb

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))  # agent_support, by name

from agent_support import next_matching  # noqa: E402
from test_multi_file_weights import (  # noqa: E402
    REVISION, published, safetensors, sharded_checkpoint, start_vllm_agent,
)

LORAS = "acme/loras"


def peft_files(rank: int, folder: str = "") -> dict[str, bytes]:
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj"],
              "rank_pattern": {"layers.3.self_attn.q_proj": rank // 2}}
    return {f"{folder}adapter_config.json": json.dumps(config).encode(),
            f"{folder}adapter_model.safetensors": safetensors("base_model.model.q.lora_A.weight", 8 * rank)}


def on_hub(hub, files: dict[str, bytes]) -> list[pb.WeightsFile]:
    return [pb.WeightsFile(source=f"hf://{LORAS}@{REVISION}/{name}",
                           sha256=hub.state.add(LORAS, name, content, revision=REVISION))
            for name, content in files.items()]


async def test_vllm_gets_the_directory_holding_the_adapter_config_with_its_rank(tmp_path, hub):
    sql = pb.LoraAdapter(name="sql", weights=on_hub(hub, peft_files(32, "sql/")))
    poet = pb.LoraAdapter(name="poet", weights=on_hub(hub, peft_files(8)))
    files = [*sql.weights, *poet.weights]
    paths = await fetch(files, tmp_path, hf_endpoint=hub.url)
    got = lay_out_adapters("vllm", [sql, poet], paths, tmp_path)
    assert [(a.name, a.rank) for a in got] == [("sql", 32), ("poet", 8)]
    assert got[0].path.name == "sql" and got[0].path.parent.parent == tmp_path / "models"
    assert json.loads((got[0].path / "adapter_config.json").read_text())["r"] == 32
    assert (got[1].path / "adapter_model.safetensors").read_bytes() == peft_files(8)["adapter_model.safetensors"]


async def test_llama_cpp_gets_each_adapters_gguf_from_the_cache(tmp_path):
    (tmp_path / "src").mkdir()
    sources = []
    for name in ("pirate", "poet"):
        content = b"GGUF" + name.encode() * 100
        (tmp_path / "src" / f"{name}.gguf").write_bytes(content)
        sources.append(pb.WeightsFile(source=f"file://{tmp_path}/src/{name}.gguf",
                                      sha256=hashlib.sha256(content).hexdigest()))
    adapters = [pb.LoraAdapter(name=s.source.rsplit("/", 1)[1][:-5], weights=[s]) for s in sources]
    paths = await fetch(sources, tmp_path / "w")
    got = lay_out_adapters("llama.cpp", adapters, paths, tmp_path / "w")
    assert [(a.name, a.path, a.rank) for a in got] == [("pirate", paths[0], 0), ("poet", paths[1], 0)]


@pytest.mark.parametrize(("text", "rank"), [
    ('{"r": 16}', 16), ('{"r": 8, "rank_pattern": {"q_proj": 64}}', 64), ("{}", 0),
])
def test_the_rank_is_the_largest_the_peft_config_names(text, rank):
    assert peft_rank(text, "adapter x") == rank


@pytest.mark.parametrize("text", ["not json", "[16]", '{"r": "sixteen"}'])
def test_a_config_that_is_not_a_peft_lora_config_is_refused_naming_the_adapter(text):
    with pytest.raises(WeightsError, match="adapter x: adapter_config.json is not a PEFT LoRA config"):
        peft_rank(text, "adapter x")


async def test_an_agent_fetches_the_adapters_with_the_weights_and_starts_vllm_serving_them(tmp_path, hub, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    model = published(hub, sharded_checkpoint())
    adapter = pb.LoraAdapter(name="tiny-sql", weights=on_hub(hub, peft_files(64)))
    async with trio.open_nursery() as nursery:
        link = await start_vllm_agent(nursery, tmp_path)
        await link.send(control_message(command_id="s", start_shard=pb.StartShard(
            shard_id="tiny-0/0", replica_id="tiny-0", model="tiny", engine="vllm", engine_version="0.32.0",
            weights=[pb.WeightsFile(source=s.source, sha256=s.sha256) for s in model], replica_key="k",
            adapters=[adapter])))
        ready = await next_matching(link, lambda m: m.WhichOneof("body") == "shard_status"
                                    and m.shard_status.state in ("ready", "failed"))
        assert ready.shard_status.state == "ready", ready.shard_status.error
        argv = json.loads(next((tmp_path / "state" / "shards").glob("*.json")).read_text())["spec"]["argv"]
        name, _, directory = argv[argv.index("--lora-modules") + 1].partition("=")
        assert name == "tiny-sql" and "--enable-lora" in argv and argv[argv.index("--max-lora-rank") + 1] == "64"
        assert Path(directory).parent == tmp_path / "state" / "weights" / "models"
        assert json.loads((Path(directory) / "adapter_config.json").read_text())["r"] == 64
        fetched = {path.rsplit("/", 1)[-1] for method, path, _ in hub.state.log if "/resolve/" in path}
        assert {"adapter_config.json", "adapter_model.safetensors", "config.json"} <= fetched
        nursery.cancel_scope.cancel()


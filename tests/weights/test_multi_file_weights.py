"""Multi-file weights: a sharded safetensors checkpoint (index JSON, two shards, config) and a GGUF in three splits,
generated small here, served over real HTTP by the Hub stand-in, fetched and verified with progress, laid out under
their names, and given to the engine as it expects (vLLM: the directory; llama.cpp: the first split)."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import pytest
import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.agent.weights import WeightsSpec, fetch
from llmgw.agent.weights_layout import engine_model_path, repository_path
from llmgw.errors import WeightsError
from llmgw.wire import control_message, pb
from support.stand_ins import python_tool

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))  # agent_support, by name

from agent_support import ControlSide, next_matching  # noqa: E402

REVISION = "c" * 40
REPO = "acme/tiny-llm"


def safetensors(name: str, values: int) -> bytes:
    """A valid safetensors file holding one F32 tensor `name` of `values` numbers (header length, JSON, data)."""
    header = json.dumps({name: {"dtype": "F32", "shape": [values], "data_offsets": [0, 4 * values]}}).encode()
    return struct.pack("<Q", len(header)) + header + struct.pack(f"<{values}f", *range(values))


def sharded_checkpoint() -> dict[str, bytes]:
    shards = {"model-00001-of-00002.safetensors": safetensors("embed.weight", 64),
              "model-00002-of-00002.safetensors": safetensors("lm_head.weight", 32)}
    index = {"metadata": {"total_size": 384}, "weight_map": {"embed.weight": "model-00001-of-00002.safetensors",
                                                             "lm_head.weight": "model-00002-of-00002.safetensors"}}
    return {"config.json": b'{"architectures": ["Gemma3ForCausalLM"]}', **shards,
            "model.safetensors.index.json": json.dumps(index).encode()}


def gguf_splits() -> dict[str, bytes]:
    return {f"gguf/tiny-{i:05d}-of-00003.gguf": b"GGUF" + os.urandom(50_000) for i in (1, 2, 3)}


def published(hub, files: dict[str, bytes]) -> list[WeightsSpec]:
    return [WeightsSpec(f"hf://{REPO}@{REVISION}/{name}", hub.state.add(REPO, name, content, revision=REVISION))
            for name, content in files.items()]


def test_a_files_name_is_its_path_in_the_repository():
    assert repository_path(f"hf://{REPO}@{REVISION}/gguf/tiny-00001-of-00003.gguf") == "gguf/tiny-00001-of-00003.gguf"
    assert repository_path("https://example.com/files/config.json?x=1") == "config.json"
    with pytest.raises(WeightsError, match="name a file"):
        repository_path(f"hf://{REPO}/../escape")


async def test_a_sharded_safetensors_checkpoint_is_fetched_with_progress_and_given_to_vllm_as_its_directory(
        tmp_path, hub):
    files = sharded_checkpoint()
    specs = published(hub, files)
    seen = []
    paths = await fetch(specs, tmp_path, hf_endpoint=hub.url, progress=lambda f, t: seen.append(f))
    assert seen[-1] == 1.0 and len(hub.state.log) >= 2 * len(files)  # every file resolved and downloaded
    model = engine_model_path("vllm", [s.source for s in specs], paths, tmp_path)
    assert model.parent == tmp_path / "models"
    assert {p.name: p.read_bytes() for p in model.iterdir() if not p.name.startswith(".")} == files
    assert engine_model_path("vllm", [s.source for s in specs], paths, tmp_path) == model  # laid out once
    assert os.stat(model / "config.json").st_ino == os.stat(paths[0]).st_ino  # a hard link, not a copy


async def test_gguf_splits_are_given_to_llama_cpp_as_the_first_split_beside_the_others(tmp_path, hub):
    files = gguf_splits()
    specs = published(hub, dict(reversed(files.items())))  # any order in the catalog
    paths = await fetch(specs, tmp_path, hf_endpoint=hub.url)
    model = engine_model_path("llama.cpp", [s.source for s in specs], paths, tmp_path)
    assert model.name == "tiny-00001-of-00003.gguf"
    assert {p.name: p.read_bytes() for p in model.parent.iterdir()} == {Path(n).name: c for n, c in files.items()}


@pytest.mark.parametrize(("drop", "named"), [
    ("model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors is named by its other files"),
    ("gguf/tiny-00003-of-00003.gguf", "gguf/tiny-00003-of-00003.gguf is named by its other files"),
])
async def test_an_incomplete_set_is_refused_naming_the_missing_file(tmp_path, hub, drop, named):
    files = {**sharded_checkpoint(), **gguf_splits()}
    del files[drop]
    specs = published(hub, files)
    paths = await fetch(specs, tmp_path, hf_endpoint=hub.url)
    with pytest.raises(WeightsError, match=f"{named} but not listed; add each to the catalog's weights:"):
        engine_model_path("vllm", [s.source for s in specs], paths, tmp_path)
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


async def start_vllm_agent(nursery, tmp_path: Path):
    """An agent (state in `tmp_path`/state) whose vllm@0.32.0 is the stand-in tests/support/fake_vllm_server.py;
    returns its link once it registered."""
    vllm = python_tool(tmp_path / "vllm", Path(__file__).resolve().parents[1] / "support" / "fake_vllm_server.py")
    config = AgentConfig(node_id="n", state_dir=tmp_path / "state", heartbeat_interval=0.5,
                         engine_binaries={"vllm@0.32.0": vllm}, stop_shards_on_exit=True)
    control = ControlSide()
    await nursery.start(run_agent, config, control.connect)
    link = await control.links.receive()
    await link.receive()  # Register
    return link


@pytest.mark.parametrize("listed", ["file by file", "as the repository directory"])
async def test_an_agent_starts_vllm_on_the_laid_out_checkpoint_after_reporting_the_fetch(tmp_path, hub, monkeypatch,
                                                                                         listed):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    files = sharded_checkpoint()
    specs = published(hub, files)
    weights = ([pb.WeightsFile(source=s.source, sha256=s.sha256) for s in specs] if listed == "file by file"
               else [pb.WeightsFile(source=f"hf://{REPO}@{REVISION}/")])
    async with trio.open_nursery() as nursery:
        link = await start_vllm_agent(nursery, tmp_path)
        await link.send(control_message(command_id="s", start_shard=pb.StartShard(
            shard_id="tiny-0/0", replica_id="tiny-0", model="tiny", engine="vllm", engine_version="0.32.0",
            weights=weights, replica_key="k")))
        fetching = await next_matching(link, lambda m: m.WhichOneof("body") == "shard_status"
                                       and m.shard_status.state == "fetching" and m.shard_status.progress == 1.0)
        assert fetching.shard_status.model == "tiny"
        ready = await next_matching(link, lambda m: m.WhichOneof("body") == "shard_status"
                                    and m.shard_status.state in ("ready", "failed"))
        assert ready.shard_status.state == "ready", ready.shard_status.error
        record = json.loads(next((tmp_path / "state" / "shards").glob("*.json")).read_text())
        argv = record["spec"]["argv"]
        model = Path(argv[argv.index("serve") + 1])
        assert model.parent == tmp_path / "state" / "weights" / "models" and (model / "config.json").is_file()
        assert sorted(p.name for p in model.iterdir() if not p.name.startswith(".")) == sorted(files)
        nursery.cancel_scope.cancel()

"""Precise prefix routing through a whole in-process fleet: a real control plane placing two replicas of a vLLM
model on a real agent, whose engines are a vLLM stand-in (tests/support/fake_vllm_server.py) publishing KV-cache
events as vLLM 0.32 does; the agent's listeners, its stream, the control plane's mirror and the gateway's router
are the real ones. Requests sharing a long prefix follow the blocks."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import init_repository
from support.stand_ins import python_tool

from .conftest import ROOT, write_seed
from .test_in_process_fleet import replica_states, wait_for

FAKE_VLLM = ROOT / "tests" / "support" / "fake_vllm_server.py"
MODEL = """\
name: tiny
engine: vllm
engine_version: 0.11.0
weights:
  - source: https://example.invalid/tiny/config.json
    sha256: {config}
  - source: https://example.invalid/tiny/model.safetensors
    sha256: {tensors}
replicas: 2
resources:
  cpu_cores: 0.1
  memory: 64Mi
context_size: 512
"""


def _mirror(directory: Path, *contents: bytes) -> list[str]:
    (directory / "sha256").mkdir(parents=True)
    digests = []
    for content in contents:
        digest = hashlib.sha256(content).hexdigest()
        (directory / "sha256" / digest).write_bytes(content)
        digests.append(digest)
    return digests


async def test_requests_sharing_a_prefix_go_to_the_replica_whose_engine_reported_holding_it(tmp_path):
    config, tensors = _mirror(tmp_path / "mirror", b'{"architectures": ["Gemma3ForCausalLM"]}', b"tensors")
    seed = write_seed(tmp_path / "seed", config)
    (seed / "catalog" / "tiny.yaml").write_text(MODEL.format(config=config, tensors=tensors))
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    vllm = python_tool(tmp_path / "vllm", FAKE_VLLM)
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        agent = AgentConfig(node_id="n1", state_dir=tmp_path / "agent", mirrors=(str(tmp_path / "mirror"),),
                            heartbeat_interval=0.2, engine_binaries={"vllm@0.11.0": vllm},
                            stop_shards_on_exit=True, shard_stop_grace=2.0)
        await nursery.start(run_agent, agent, plane.local_connector())
        await wait_for(lambda: replica_states(plane) == {"tiny-0": "ready", "tiny-1": "ready"}, 30, "2 ready",
                       plane.status)
        await wait_for(lambda: len(plane.table.models["tiny"].replicas) == 2, 10, "two routes")
        _record, api_key = plane.store.create_api_key("demo")
        prefix = "Every night the lighthouse keeper counts the waves. " * 3  # 159 bytes: 9 blocks of 16

        async with httpx.AsyncClient(base_url=plane.gateway_url, timeout=10,
                                     headers={"Authorization": f"Bearer {api_key}"}) as client:
            async def ask(prompt: str) -> str:
                reply = await client.post("/v1/completions", json={"model": "tiny", "prompt": prompt,
                                                                   "max_tokens": 4})
                assert reply.status_code == 200, reply.text
                return reply.headers["x-llmgw-replica"]

            first = await ask(prefix + "Why?")
            await wait_for(lambda: len(getattr(plane.gateway.blocks.replicas.get(first), "blocks", ())) >= 9, 10,
                           f"{first}'s blocks mirrored in the gateway")
            holder = plane.gateway.blocks.replicas[first]
            assert (holder.node_id, holder.block_size, holder.hash_algorithm, holder.hash_seed) == (
                "n1", 16, "sha256_cbor", "0")
            assert [await ask(prefix + question) for question in ("How?", "When?", "Where?", "Who?")] == [first] * 4
            kinds = {s.labels["kind"]: s.value for m in plane.gateway.metrics.registry.collect()
                     if m.name == "llmgw_gateway_routing_decisions" for s in m.samples if s.name.endswith("_total")}
            assert kinds.get("precise") == 4.0
        nursery.cancel_scope.cancel()

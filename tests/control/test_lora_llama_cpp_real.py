"""LoRA adapters end to end on the real llama-server with Gemma 3 270M: two GGUF LoRAs made here (seeded random,
rank 4, written with the `gguf` package as llama.cpp's converter writes them) are named in the catalog, fetched by a
real agent with the weights, loaded unapplied, and chosen per request by the gateway when a client (the official
openai SDK) names one as its model. Each changes greedy output against the base model, which still answers as a
llama-server without adapters does; projects are allowed adapters by name and billed under it; changing the
adapters restarts the replica."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import openai
import pytest
import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import init_repository

from .test_in_process_fleet import push_catalog, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from llama_server_process import TEST_THREADS, running_llama_server  # noqa: E402
from lora_adapters import write_gguf_lora  # noqa: E402
from settings_seed import GEMMA_HEAD, projects_yaml  # noqa: E402
from settings_seed import write_seed as seed_tree  # noqa: E402

pytestmark = pytest.mark.slow
PROMPT = "The old lighthouse on the hill"
MODEL = GEMMA_HEAD + f"""\
resources:
  cpu_cores: {TEST_THREADS}
  memory: 1Gi
context_size: 2048
engine_args: ["--no-jinja", "--chat-template", "gemma"]
prices:
  prompt_per_million: 1.0
  completion_per_million: 2.0
adapters:
{{adapters}}"""
"""The replica's engine runs `TEST_THREADS` threads (its `cpu_cores`), as the plain llama-server below: one, because
`make test` keeps both cores busy (tests/support/llama_server_process.py)."""
PROJECTS = projects_yaml({"demo": {"models": ["gemma-3-270m", "gemma-pirate", "gemma-poet"]},
                          "pirates": {"models": ["gemma-pirate"]}})


def adapters_yaml(loras: dict[str, tuple[Path, str]]) -> str:
    return "".join(f"  - name: {name}\n    weights:\n      - source: file://{path}\n        sha256: {sha}\n"
                   for name, (path, sha) in loras.items())


async def greedy(sdk: openai.AsyncOpenAI, model: str) -> str:
    answer = await sdk.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=0, seed=1)
    assert answer.usage.completion_tokens == 16 and answer.model == model
    return answer.choices[0].text


def engine_argv(agent_state: Path) -> list[str]:
    """The command line of the shard the agent started last (its record in the agent's state)."""
    newest = max((agent_state / "shards").glob("*.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(newest.read_text())["spec"]["argv"]


async def test_gguf_loras_are_fetched_loaded_unapplied_chosen_per_request_and_billed_under_their_names(
        tmp_path, llama_server_binary, gemma_mirror, gemma_gguf):
    loras = {}
    for seed, name in enumerate(("gemma-pirate", "gemma-poet")):
        path = tmp_path / "loras" / f"{name}.gguf"
        path.parent.mkdir(exist_ok=True)
        loras[name] = (path, write_gguf_lora(gemma_gguf, path, seed=seed))
    tree = seed_tree(tmp_path / "seed", "gemma-3-270m",
                     MODEL.format(adapters=adapters_yaml(loras)))
    (tree / "projects.yaml").write_text(PROJECTS)
    repo = tmp_path / "settings.git"
    init_repository(repo, tree)
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state"))
    agent_state = tmp_path / "agent"
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        await nursery.start(run_agent, AgentConfig(
            node_id="n1", state_dir=agent_state, mirrors=(str(gemma_mirror),), heartbeat_interval=0.2,
            engine_binaries={"llama.cpp@b11434": llama_server_binary}, stop_shards_on_exit=True,
            shard_stop_grace=2.0), plane.local_connector())
        await wait_for(lambda: plane.table.models.get("gemma-poet") and plane.table.models["gemma-poet"].replicas,
                       120, "gemma-3-270m-0 ready with its adapters", plane.status)

        # fetched with the weights into the agent's cache, given to llama-server in catalog order, unapplied
        argv = engine_argv(agent_state)
        cache = agent_state / "weights" / "sha256"
        assert [argv[i + 1] for i, a in enumerate(argv) if a == "--lora-scaled"] == [
            f"{cache / loras['gemma-pirate'][1]}:0", f"{cache / loras['gemma-poet'][1]}:0"]
        assert "--lora-init-without-apply" in argv

        demo = openai.AsyncOpenAI(base_url=plane.gateway_url + "/v1", max_retries=0,
                                  api_key=plane.store.create_api_key("demo")[1])
        listed = {m.id: getattr(m, "parent", None) async for m in demo.models.list()}
        assert listed == {"gemma-3-270m": None, "gemma-pirate": "gemma-3-270m", "gemma-poet": "gemma-3-270m"}

        base, pirate, poet = [await greedy(demo, m) for m in ("gemma-3-270m", "gemma-pirate", "gemma-poet")]
        print(f"\nbase:   {base!r}\npirate: {pirate!r}\npoet:   {poet!r}")
        assert len({base, pirate, poet}) == 3  # each adapter changes greedy output, and differently
        # switching back and forth on one engine gives the same answers (no adapter left applied)
        assert [await greedy(demo, m) for m in ("gemma-poet", "gemma-3-270m", "gemma-pirate")] == [poet, base, pirate]

        # unapplied really means unapplied: a llama-server given no adapter answers as the base name does
        async with running_llama_server(llama_server_binary, gemma_gguf, tmp_path / "plain.log",
                                        api_key="plain-key") as plain:
            alone = openai.AsyncOpenAI(base_url=plain.base_url + "/v1", api_key="plain-key", max_retries=0)
            assert await greedy(alone, "gemma-3-270m") == base

        # allowed by its own name, billed under it at the model's prices
        pirates = openai.AsyncOpenAI(base_url=plane.gateway_url + "/v1", max_retries=0,
                                     api_key=plane.store.create_api_key("pirates")[1])
        assert await greedy(pirates, "gemma-pirate") == pirate
        with pytest.raises(openai.PermissionDeniedError):
            await greedy(pirates, "gemma-3-270m")
        records = plane.store.recent_usage(project="pirates")
        assert [(r.model, r.status, r.completion_tokens) for r in records] == [
            ("gemma-3-270m", 403, 0), ("gemma-pirate", 200, 16)]
        assert records[1].cost == pytest.approx((records[1].prompt_tokens * 1.0 + 16 * 2.0) / 1e6)

        # dropping an adapter is a new generation: the replica restarts without it, and its name is gone
        argv_before = argv
        del loras["gemma-poet"]

        def drop_poet(checkout: Path) -> None:  # projects.yaml may not name an adapter gone (validate refuses it)
            (checkout / "catalog" / "gemma-3-270m.yaml").write_text(
                MODEL.format(adapters=adapters_yaml(loras)))
            (checkout / "projects.yaml").write_text(PROJECTS.replace(", gemma-poet", ""))
        await push_catalog(tmp_path / "checkout", repo, drop_poet, "gemma: drop the poet adapter")
        await wait_for(lambda: "gemma-poet" not in plane.table.models and plane.table.models["gemma-pirate"].replicas,
                       120, "the replica back with one adapter", plane.status)
        argv = engine_argv(agent_state)
        assert argv != argv_before and argv.count("--lora-scaled") == 1
        with pytest.raises(openai.NotFoundError):
            await greedy(demo, "gemma-poet")
        assert await greedy(demo, "gemma-pirate") == pirate
        nursery.cancel_scope.cancel()

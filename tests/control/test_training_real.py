"""`llmgw train` end to end on this machine's CPU (docs/training.md): a control plane and a real agent serving Gemma 3
270M on the real llama-server; a job submitted through the admin API trains a small LoRA with PEFT on the converted
Gemma (`make vllm`'s conversion) in the pinned training venv (`make train-env`), its base named by source (the
converted Gemma served as hf://google/gemma-3-270m@<revision>/ by a local stand-in of the Hub, tests/plan/hub_files.py)
and fetched by the agent, from the twenty question/answer pairs of examples/training/gull-rock.jsonl, reporting loss
and peak memory as it goes (the loss falls); the agent converts it to GGUF with llama.cpp's own
convert_lora_to_gguf.py and sends it back in pieces kept in the store; `llmgw train get JOB --add-to-catalog`
downloads it and commits it to the model's adapters; the replica restarts with it, and the gateway serves it by name:
a temperature-0 answer different from the base model's."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import trio

from llmgw.agent import AgentConfig, run_agent
from llmgw.control import ControlConfig, ControlPlane
from llmgw.engines.vllm_demo import ensure_gemma_hf, ensure_vllm
from llmgw.settings import init_repository
from llmgw.training.environment import ensure_training_env

from plan.hub_files import serve_directory

from support.in_process_cli import run_llmgw

from .test_in_process_fleet import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from settings_seed import GEMMA_HEAD, projects_yaml  # noqa: E402
from settings_seed import write_seed as seed_tree  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PAIRS = ROOT / "examples" / "training" / "gull-rock.jsonl"
PROMPT = "Question: Who keeps the lighthouse on Gull Rock?\nAnswer:"
THREADS = 2
"""The engine's threads (the model's `cpu_cores`): two. One was faster under load
(tests/support/llama_server_process.py's TEST_THREADS says why), but a whole run with one engine thread and one
training thread saw the trained adapter leave the temperature-0 answer unchanged once (3 whole runs, 2 passed; cause
not found): two, as every earlier run had."""
TRAINING_THREADS = 1
"""The training's torch threads (`AgentConfig.training_threads`): one. The training is seeded, and its adapter is the
same bytes on one thread as on two (adapter_model.safetensors' sha256 compared, 2026-12-05), so the thread count
cannot change the answer; on 2 busy cores two OpenMP threads wait for each other at every operation (4 steps at a
load average of 14: 66 s on two threads, 5.4 s on one)."""
MODEL = GEMMA_HEAD + f"""\
resources:
  cpu_cores: {THREADS}
  memory: 1Gi
context_size: 1024
engine_args: ["--no-jinja", "--chat-template", "gemma"]
"""
HYPER = {"rank": 4, "alpha": 8, "steps": 4, "batch_size": 2, "learning_rate": 0.005, "max_length": 32}
"""Tiny and fast: 4 steps of 2 pairs, rank 4 on q_proj and v_proj."""


def cache() -> Path:
    return Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")


@pytest.fixture(scope="module")
def gemma_hf() -> Path:
    """Gemma 3 270M in Hugging Face format, as `make vllm` converts it (cached: a stat when it ran)."""
    return ensure_gemma_hf(cache(), trio.run(ensure_vllm, cache()))


@pytest.fixture(scope="module")
def training_python() -> Path:
    """The pinned training venv (`make train-env`; cached: a stat when it ran)."""
    return ensure_training_env(cache() / "engines")


async def llmgw(plane: ControlPlane, *args: str) -> str:
    """Run the `llmgw` CLI against `plane`'s admin API, in this process in a thread (support.in_process_cli: a
    process start costs seconds of imports on a loaded machine); its output (it must succeed)."""
    code, out, err = await trio.to_thread.run_sync(
        run_llmgw, [*args, "--url", plane.admin_url, "--token", plane.admin_token])
    said = out + err
    assert code == 0, said
    return said


async def greedy(sdk: openai.AsyncOpenAI, model: str) -> str:
    answer = await sdk.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, seed=1)
    assert answer.usage.completion_tokens >= 1 and answer.model == model
    return answer.choices[0].text


@pytest.fixture
def hub(gemma_hf, monkeypatch):
    """The converted Gemma as hf://google/gemma-3-270m@<"c" * 40>/ on a local stand-in of the Hub ($HF_ENDPOINT)."""
    server = serve_directory("google/gemma-3-270m", gemma_hf)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    try:
        yield server
    finally:
        server.close()


async def test_a_lora_trained_on_a_node_is_converted_kept_downloaded_added_and_served_by_name(
        tmp_path, llama_server_binary, gemma_mirror, gemma_hf, training_python, hub):
    tree = seed_tree(tmp_path / "seed", "gemma-3-270m", MODEL)
    (tree / "projects.yaml").write_text(projects_yaml({"demo": {"models": ["*"]}}))  # the adapter too, once added
    repo = tmp_path / "settings.git"
    init_repository(repo, tree)
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state"))
    timings: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        await nursery.start(run_agent, AgentConfig(
            node_id="n1", state_dir=tmp_path / "agent", mirrors=(str(gemma_mirror),), heartbeat_interval=0.2,
            engine_binaries={"llama.cpp@b11434": llama_server_binary}, stop_shards_on_exit=True,
            shard_stop_grace=2.0, training_python=training_python, training_threads=TRAINING_THREADS),
            plane.local_connector())
        await wait_for(lambda: plane.table.models.get("gemma-3-270m") and plane.table.models["gemma-3-270m"].replicas,
                       120, "gemma-3-270m-0 ready", plane.status)
        sdk = openai.AsyncOpenAI(base_url=plane.gateway_url + "/v1", max_retries=0,
                                 api_key=plane.store.create_api_key("demo")[1])
        base = await greedy(sdk, "gemma-3-270m")

        admin = httpx.AsyncClient(base_url=plane.admin_url, timeout=30,
                                  headers={"Authorization": f"Bearer {plane.admin_token}"})
        started = time.monotonic()
        said = await llmgw(plane, "train", "submit", "--job", "gull-rock", "--model", "gemma-3-270m", "--base",
                           f"hf://google/gemma-3-270m@{'c' * 40}/", "--pairs", str(PAIRS), "--memory", "512Mi",
                           *[f"--{k.replace('_', '-')}={v}" for k, v in HYPER.items()])
        assert said.startswith("gull-rock            gemma-3-270m     starting   n1           step 0/4"), said
        submitted = plane.training_job("gull-rock")
        assert (submitted["pairs"], submitted["hyper"]["rank"], submitted["memory_bytes"]) == (20, 4, 512 << 20)
        refused = await admin.post("/api/v1/training", json={"job": "gull-rock", "model": "gemma-3-270m",
                                                             "base": str(gemma_hf), "pairs": PAIRS.read_text()})
        assert refused.status_code == 409 and "exists already" in refused.json()["error"]["message"]

        seen = []

        def job():
            status = plane.training_job("gull-rock")
            if status["state"] not in [s for s, _ in seen[-1:]]:
                seen.append((status["state"], round(time.monotonic() - started, 1)))
            return status if status["state"] in ("done", "failed", "cancelled") else None

        status = await wait_for(job, 240, "the training job to end", plane.training_jobs)
        timings["train, convert and keep"] = time.monotonic() - started
        print(f"\nstates: {seen}\nlosses: {status['losses']}\npeak memory: {status['peak_memory_bytes']>>20} MiB")
        assert status["state"] == "done", status
        assert {"running", "converting"} <= {state for state, _ in seen}, seen  # reported as it went
        # fetched: the Hub listed the directory and served the files kept in git (the safetensors too, unless the
        # agent's mirror holds them by sha256, as `make vllm`'s does here: linked from there)
        print(f"served by the Hub stand-in: {dict(hub.served)}")
        assert hub.served["config.json"] == (gemma_hf / "config.json").stat().st_size
        losses = status["losses"]
        assert len(losses) == HYPER["steps"] and losses[-1] < losses[0] / 2  # the loss falls
        assert status["peak_memory_bytes"] > 200 << 20  # the process holds Gemma in float32: more than 200 MiB
        assert status["adapter"]["name"] == "adapter.gguf" and status["adapter"]["kept"] == status["adapter"]["count"]

        # `llmgw train get --add-to-catalog`: the file written, checked, and committed as the model's adapter
        out = tmp_path / "gull-rock.gguf"
        said = await llmgw(plane, "train", "get", "gull-rock", "-o", str(out), "--add-to-catalog",
                           "--author-name", "Op", "--author-email", "op@example.com")
        assert out.read_bytes()[:4] == b"GGUF" and "gemma-3-270m: adapter gull-rock added" in said, said
        await wait_for(lambda: plane.table.models.get("gull-rock") and plane.table.models["gull-rock"].replicas,
                       120, "the replica back with the adapter", plane.status)
        adapted = await greedy(sdk, "gull-rock")
        timings["end to end"] = time.monotonic() - started
        print(f"base:    {base!r}\nadapted: {adapted!r}\ntimings: {timings}")
        assert adapted != base  # the trained adapter changes the temperature-0 answer
        assert await greedy(sdk, "gemma-3-270m") == base  # the base model's answer is still the base model's
        await admin.aclose()
        nursery.cancel_scope.cancel()

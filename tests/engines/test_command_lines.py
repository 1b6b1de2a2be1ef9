"""Each engine's command line and environment: the key never on argv, devices and threads where they belong."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.engines import Launch, get_engine, llamacpp, sglang, vllm
from llmgw.errors import EngineError

KEY = "sk-engine-0123456789"


def launch(**overrides) -> Launch:
    values = dict(binary=Path("/opt/engines/llama-server"), model_path=Path("/w/sha256/abc"), host="127.0.0.1",
                  port=40123, threads=2, context_size=2048, served_name="gemma-3-270m", api_key=KEY)
    values.update(overrides)
    return Launch(**values)


@pytest.mark.parametrize("module", [llamacpp, vllm, sglang])
def test_replica_key_is_in_the_environment_and_never_on_the_command_line(module):
    argv, env = module.command_line(launch())
    assert all(KEY not in arg for arg in argv)
    assert env[module.API_KEY_ENV] == KEY


@pytest.mark.parametrize("module", [llamacpp, vllm, sglang])
def test_no_key_means_no_key_variable(module):
    _, env = module.command_line(launch(api_key=""))
    assert module.API_KEY_ENV not in env


def test_llama_server_cpu_shard_gets_host_port_model_alias_context_threads_and_metrics():
    argv, env = llamacpp.command_line(launch(engine_args=("--no-jinja", "--chat-template", "gemma")))
    assert argv == ["/opt/engines/llama-server", "--host", "127.0.0.1", "--port", "40123", "-m", "/w/sha256/abc",
                    "--alias", "gemma-3-270m", "-c", "2048", "--threads", "2", "--metrics",
                    "--no-jinja", "--chat-template", "gemma"]
    assert "-ngl" not in argv
    assert env == {"CUDA_VISIBLE_DEVICES": "", "LLAMA_API_KEY": KEY}


def test_llama_server_gpu_shard_offloads_every_layer_to_its_own_devices():
    argv, env = llamacpp.command_line(launch(devices=("2", "3")))
    assert argv[argv.index("-ngl") + 1] == "999"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_vllm_serves_the_model_with_its_parallelism():
    argv, env = vllm.command_line(launch(binary=Path("/venv/bin/vllm"), devices=("0", "1"), tensor_parallel=2))
    assert argv[:3] == ["/venv/bin/vllm", "serve", "/w/sha256/abc"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "1"
    assert argv[argv.index("--served-model-name") + 1] == "gemma-3-270m"
    assert argv[argv.index("--max-model-len") + 1] == "2048"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["OMP_NUM_THREADS"] == "2"


def test_sglang_without_key_runs_its_launch_module():
    argv, env = sglang.command_line(launch(binary=Path("/venv/bin/python"), api_key="", tensor_parallel=4))
    assert argv[:3] == ["/venv/bin/python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--tp-size") + 1] == "4"
    assert "--enable-metrics" in argv


def test_sglang_key_reaches_the_server_arguments_only_inside_the_interpreter(tmp_path):
    argv, env = sglang.command_line(launch(binary=Path("/venv/bin/python")))
    # Run the starter with a stand-in `sglang.launch_server` module that prints what it received.
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text("import sys, json, os\nprint(json.dumps([sys.argv[1:], "
                                              "os.environ.get('SGLANG_API_KEY')]))\n")
    import json
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, *argv[1:]], env={**os.environ, **env, "PYTHONPATH": str(tmp_path)},
                            capture_output=True, text=True, check=True)
    received, key_left_in_env = json.loads(result.stdout)
    assert received[-2:] == ["--api-key", KEY]
    assert received[:2] == ["--model-path", "/w/sha256/abc"]
    assert key_left_in_env is None


@pytest.mark.parametrize("name,module", [("llama.cpp", llamacpp), ("llamacpp", llamacpp), ("vLLM", vllm),
                                         ("sglang", sglang)])
def test_engines_are_found_by_name(name, module):
    assert get_engine(name) is module


def test_unknown_engine_names_the_known_ones():
    with pytest.raises(EngineError, match="llama.cpp, vllm, sglang"):
        get_engine("tgi")


@pytest.mark.parametrize("module", [llamacpp, vllm, sglang])
def test_every_engine_names_its_health_path_and_core_metrics(module):
    assert module.HEALTH_PATH == "/health"
    assert module.METRICS.requests_running in module.METRICS.all_names
    assert module.METRICS.kv_cache_usage in module.METRICS.all_names


def test_every_series_of_a_real_llama_server_metrics_page_is_a_known_name():
    page = (Path(__file__).parent / "captures" / "llama-server-metrics.txt").read_text()
    exported = {line.split()[0] for line in page.splitlines() if line and not line.startswith("#")}
    assert exported <= set(llamacpp.METRICS.all_names)
    core = [llamacpp.METRICS.requests_running, llamacpp.METRICS.requests_waiting,
            llamacpp.METRICS.prompt_tokens_total, llamacpp.METRICS.generation_tokens_total]
    assert set(core) <= exported


def spread(rank: int, **overrides) -> Launch:
    """A shard of a llama.cpp replica over three nodes (rank 0 on 10.0.0.1; ranks 1 and 2 serve RPC)."""
    values = dict(rank=rank, nodes=3, devices=("0", "1"), extra_env={"NCCL_IB_HCA": "mlx5_0"},
                  host="10.0.0.2" if rank else "127.0.0.1", port=50052 if rank else 40123,
                  engine_args=("--no-jinja",), peers=("10.0.0.2:50052", "10.0.0.3:50052") if rank == 0 else ())
    values.update(overrides)
    return launch(**values)


def test_llama_cpp_rank_0_of_a_spread_replica_serves_with_every_other_ranks_rpc_server():
    argv, env = llamacpp.command_line(spread(0))
    assert argv[0] == "/opt/engines/llama-server" and argv[argv.index("-m") + 1] == "/w/sha256/abc"
    assert argv[argv.index("--rpc") + 1] == "10.0.0.2:50052,10.0.0.3:50052"
    assert argv.count("--rpc") == 1 and argv[-1] == "--no-jinja" and "-ngl" in argv
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env[llamacpp.API_KEY_ENV] == KEY
    assert "--rpc" not in llamacpp.command_line(launch(peers=("10.0.0.2:50052",)))[0]  # one node: no RPC


@pytest.mark.parametrize("rank", [1, 2])
def test_llama_cpp_ranks_above_0_run_rpc_server_on_their_devices_without_model_key_or_engine_args(rank):
    argv, env = llamacpp.command_line(spread(rank))
    assert argv == ["/opt/engines/rpc-server", "-H", "10.0.0.2", "-p", "50052", "-t", "2"]
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_IB_HCA": "mlx5_0"}
    assert all(KEY not in arg for arg in argv) and llamacpp.API_KEY_ENV not in env
    cpu_argv, cpu_env = llamacpp.command_line(spread(rank, devices=(), threads=None))
    assert cpu_argv == ["/opt/engines/rpc-server", "-H", "10.0.0.2", "-p", "50052"]
    assert cpu_env["CUDA_VISIBLE_DEVICES"] == ""


def test_the_rpc_server_is_the_llama_server_builds_sibling_built_only_with_ggml_rpc():
    assert llamacpp.rpc_server_binary(Path("/e/llama.cpp/b11434/bin/llama-server")) == Path(
        "/e/llama.cpp/b11434/bin/rpc-server")
    assert llamacpp.RPC_BUILD_ARGS == ("-DGGML_RPC=ON",)

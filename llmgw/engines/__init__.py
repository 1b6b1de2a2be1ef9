"""llmgw.engines: one module per engine (llama.cpp, vLLM, SGLang) and llama.cpp's installs (see DESIGN.md).

Each engine module offers `NAME`, `HEALTH_PATH`, `METRICS_PATH`, `METRICS`, `API_KEY_ENV`, `command_line(launch)
-> (argv, env)`, `parse_startup_log(lines) -> StartupReport` and `startup_failure(report, expects_gpu)`.
Imports nothing of llmgw but `llmgw.errors`.
"""

from __future__ import annotations

from types import ModuleType

from llmgw.engines import llamacpp, sglang, vllm
from llmgw.engines.base import (
    ENGINE_HOST, GpuDevice, Launch, LoraAdapter, MetricNames, StartupReport, clean_line, listen_overrides,
)
from llmgw.engines.building import DEFAULT_CMAKE_ARGS, build_dir_for, build_llama_server, cmake_args, fetch_source
from llmgw.engines.downloading import Progress, sha256_file
from llmgw.engines.installing import (
    LlamaCppSource,
    check_installed,
    default_cache_dir,
    install_dir,
    installed_binary,
    verify_binary,
)
from llmgw.engines.unpacking import unpack_archive
from llmgw.errors import EngineError

ENGINES: dict[str, ModuleType] = {"llama.cpp": llamacpp, "vllm": vllm, "sglang": sglang}
_ALIASES = {"llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "llama-server": "llama.cpp"}


def get_engine(name: str) -> ModuleType:
    """The engine module for `name` ("llama.cpp", "vllm", "sglang"; "llamacpp"/"llama-server" also accepted).

    Raises EngineError listing the known engines for any other name.
    """
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in ENGINES:
        raise EngineError(f"unknown engine {name!r}; known engines: {', '.join(ENGINES)}")
    return ENGINES[key]


__all__ = [
    "DEFAULT_CMAKE_ARGS", "cmake_args", "ENGINE_HOST", "ENGINES", "GpuDevice", "Launch", "LlamaCppSource", "LoraAdapter", "MetricNames", "Progress",
    "StartupReport", "build_dir_for", "build_llama_server", "check_installed", "clean_line", "default_cache_dir",
    "fetch_source", "get_engine", "install_dir", "installed_binary", "listen_overrides", "llamacpp", "sglang", "sha256_file",
    "unpack_archive", "verify_binary", "vllm",
]

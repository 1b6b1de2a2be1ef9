"""llmgw.engines: one module per engine (llama.cpp, vLLM, SGLang) and llama.cpp's installs (see DESIGN.md).

Each engine module offers `NAME`, `HEALTH_PATH`, `METRICS_PATH`, `METRICS`, `API_KEY_ENV`, `command_line(launch)
-> (argv, env)`, `parse_startup_log(lines) -> StartupReport` and `startup_failure(report, expects_gpu)`.
Imports nothing of llmgw but `llmgw.errors`.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

from llmgw.errors import EngineError

if TYPE_CHECKING:  # the names below load on first use (`__getattr__`): see the module's last paragraph
    from llmgw.engines import llamacpp, sglang, vllm
    from llmgw.engines.base import (
        ENGINE_HOST, GpuDevice, Launch, LoraAdapter, MetricNames, StartupReport, clean_line, listen_overrides,
    )
    from llmgw.engines.building import (
        DEFAULT_CMAKE_ARGS, build_dir_for, build_llama_server, cmake_args, fetch_source,
    )
    from llmgw.engines.downloading import Progress, sha256_file
    from llmgw.engines.installing import (
        LlamaCppSource, check_installed, default_cache_dir, install_dir, installed_binary, verify_binary,
    )
    from llmgw.engines.unpacking import unpack_archive

_HOMES = {
    "llmgw.engines.base": ("ENGINE_HOST", "GpuDevice", "Launch", "LoraAdapter", "MetricNames", "StartupReport",
                           "clean_line", "listen_overrides"),
    "llmgw.engines.building": ("DEFAULT_CMAKE_ARGS", "build_dir_for", "build_llama_server", "cmake_args",
                               "fetch_source"),
    "llmgw.engines.downloading": ("Progress", "sha256_file"),
    "llmgw.engines.installing": ("LlamaCppSource", "check_installed", "default_cache_dir", "install_dir",
                                 "installed_binary", "verify_binary"),
    "llmgw.engines.unpacking": ("unpack_archive",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}
_ENGINE_MODULES = {"llama.cpp": "llmgw.engines.llamacpp", "vllm": "llmgw.engines.vllm",
                   "sglang": "llmgw.engines.sglang"}
_ALIASES = {"llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "llama-server": "llama.cpp"}


def __getattr__(name: str) -> Any:
    """The package's names load on first use (PEP 562): the engine relay (`python -m llmgw.engines.relay`, one per
    shard) imports this package first, and eager imports of the llama.cpp installer (httpx and more) cost it about
    0.6 s of every engine start."""
    if name == "ENGINES":
        return {engine: importlib.import_module(module) for engine, module in _ENGINE_MODULES.items()}
    if name in _HOME_OF:
        return getattr(importlib.import_module(_HOME_OF[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_engine(name: str) -> ModuleType:
    """The engine module for `name` ("llama.cpp", "vllm", "sglang"; "llamacpp"/"llama-server" also accepted).

    Raises EngineError listing the known engines for any other name.
    """
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in _ENGINE_MODULES:
        raise EngineError(f"unknown engine {name!r}; known engines: {', '.join(_ENGINE_MODULES)}")
    return importlib.import_module(_ENGINE_MODULES[key])


__all__ = [
    "DEFAULT_CMAKE_ARGS", "cmake_args", "ENGINE_HOST", "ENGINES", "GpuDevice", "Launch", "LlamaCppSource", "LoraAdapter", "MetricNames", "Progress",
    "StartupReport", "build_dir_for", "build_llama_server", "check_installed", "clean_line", "default_cache_dir",
    "fetch_source", "get_engine", "install_dir", "installed_binary", "listen_overrides", "llamacpp", "sglang", "sha256_file",
    "unpack_archive", "verify_binary", "vllm",
]

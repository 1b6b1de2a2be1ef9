"""Where a model would fit in the fleet, before anything is fetched (pure): the model explorer's answer
(`llmgw model plan SOURCE`, the console's Explorer page).

From a model's metadata (`llmgw.tools.model_headers.ModelFacts`) and the observed fleet:

- **Each GPU class** (`GpuState.gpu_class`, alive nodes, cards neither foreign-held nor held out by a health
  finding): the memory a replica needs is its weights plus the f16 KV cache of `context` tokens; a card gives
  `GPU_MEMORY_FRACTION` of its memory (vLLM's default `gpu_memory_utilization`). The tensor parallel needed is the
  smallest power of two of cards whose share fits; the class fits when one of its nodes has that many usable cards.
- **Each CPU node** (an alive node without GPUs): it fits when its memory (less its agent's reservation, as it
  reports it) holds the same; its expected decode tokens/s comes from `llmgw.plan.cpu_speed` (the one estimator:
  the GGUF's bytes over the read bandwidth of all its cores' threads, from its agent's probe), for a GGUF only
  (the estimator is llama.cpp's); None when the node was not probed.
- **Engines**: a GGUF runs on llama.cpp, a repository of safetensors on vLLM and SGLang (GPU) or vLLM's CPU build;
  those a node's agent says it cannot install (`engines_installable`) are left out.

Sizes in bytes, speeds in tokens per second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmgw.plan.cpu_speed import bandwidth_for_threads, estimate_decode_tokens_per_second
from llmgw.plan.types import Fleet, NodeState
from llmgw.tools.model_headers import ModelFacts
from llmgw.units import format_size

GPU_MEMORY_FRACTION = 0.9
"""The share of a card's memory an engine takes (vLLM's `gpu_memory_utilization` default)."""
DEFAULT_CONTEXT = 8192
"""The tokens of KV cache counted when the caller names no context (capped by the model's own)."""
MAX_TENSOR_PARALLEL = 64
ENGINES_BY_FORMAT = {("gguf", "gpu"): ("llama.cpp",), ("gguf", "cpu"): ("llama.cpp",),
                     ("safetensors", "gpu"): ("vllm", "sglang"), ("safetensors", "cpu"): ("vllm",)}


@dataclass(frozen=True)
class ClassFit:
    """One GPU class: `fits` on `nodes_fitting` of its `nodes`, with `tensor_parallel` cards of `card_bytes` each
    (0 when no power of two up to MAX_TENSOR_PARALLEL does), `most_cards` usable on one node; `engines` that run
    it; `why` says it in a sentence."""

    gpu_class: str
    nodes: int
    card_bytes: int
    most_cards: int
    tensor_parallel: int
    nodes_fitting: int
    fits: bool
    engines: tuple[str, ...]
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"gpu_class": self.gpu_class, "nodes": self.nodes, "card_bytes": self.card_bytes,
                "most_cards": self.most_cards, "tensor_parallel": self.tensor_parallel,
                "nodes_fitting": self.nodes_fitting, "fits": self.fits, "engines": list(self.engines),
                "why": self.why}


@dataclass(frozen=True)
class CpuNodeFit:
    """One CPU node: `fits` in its `memory_bytes`; `threads` engine threads (its cores), reading
    `bandwidth_bytes_per_second` (None: not probed) for `decode_tokens_per_second` (None: not probed, or not a
    GGUF); `engines` that run it; `why` in a sentence."""

    node_id: str
    memory_bytes: int
    fits: bool
    threads: int
    bandwidth_bytes_per_second: float | None
    decode_tokens_per_second: float | None
    engines: tuple[str, ...]
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "memory_bytes": self.memory_bytes, "fits": self.fits,
                "threads": self.threads, "bandwidth_bytes_per_second": self.bandwidth_bytes_per_second,
                "decode_tokens_per_second": self.decode_tokens_per_second, "engines": list(self.engines),
                "why": self.why}


@dataclass(frozen=True)
class ModelFit:
    """The explorer's answer for `facts`: `needed_bytes` (weights and the KV cache of `context` tokens), per GPU
    class (by name) and per CPU node (by id)."""

    facts: ModelFacts
    context: int
    needed_bytes: int
    classes: tuple[ClassFit, ...]
    cpu_nodes: tuple[CpuNodeFit, ...]

    def to_json(self) -> dict[str, Any]:
        return {"model": self.facts.to_json(), "context": self.context, "needed_bytes": self.needed_bytes,
                "classes": [c.to_json() for c in self.classes], "cpu_nodes": [n.to_json() for n in self.cpu_nodes]}


def _engines(facts: ModelFacts, kind: str, nodes: list[NodeState]) -> tuple[str, ...]:
    wanted = ENGINES_BY_FORMAT.get((facts.format, kind), ())
    return tuple(e for e in wanted if any(n.engines_installable is None or e in n.engines_installable for n in nodes))


def tensor_parallel_needed(needed_bytes: int, card_bytes: int) -> int:
    """The fewest cards, a power of two, whose usable memory (GPU_MEMORY_FRACTION each) holds `needed_bytes`
    split evenly; 0 when more than MAX_TENSOR_PARALLEL would be needed or a card has no memory."""
    usable = card_bytes * GPU_MEMORY_FRACTION
    cards = 1
    while cards <= MAX_TENSOR_PARALLEL:
        if usable > 0 and needed_bytes / cards <= usable:
            return cards
        cards *= 2
    return 0


def _class_fit(facts: ModelFacts, gpu_class: str, nodes: list[NodeState], needed: int) -> ClassFit:
    usable = {n.node_id: [g for g in n.gpus if g.gpu_class == gpu_class and not g.foreign_processes
                          and not g.unhealthy] for n in nodes}
    card = max(g.memory_total_bytes for n in nodes for g in n.gpus if g.gpu_class == gpu_class)
    most = max((len(cards) for cards in usable.values()), default=0)
    tp = tensor_parallel_needed(needed, card)
    fitting = sum(1 for cards in usable.values() if tp and len(cards) >= tp)
    engines = _engines(facts, "gpu", nodes)
    if not tp:
        why = f"needs more than {MAX_TENSOR_PARALLEL} cards of {format_size(card)}"
    elif not fitting:
        why = f"needs tensor parallel {tp}, and no node has {tp} usable cards (at most {most})"
    elif not engines:
        why = "no node of the class can install an engine for it"
    else:
        why = f"fits with tensor parallel {tp} on {fitting} of {len(nodes)} node(s)"
    return ClassFit(gpu_class, len(nodes), card, most, tp, fitting, bool(fitting and engines), engines, why)


def _cpu_fit(facts: ModelFacts, node: NodeState, needed: int) -> CpuNodeFit:
    threads = max(1, int(node.cpu_cores))
    engines = _engines(facts, "cpu", [node])
    probe = node.memory_bandwidth
    bandwidth = (bandwidth_for_threads(probe.one_core_bytes_per_second, probe.all_cores_bytes_per_second, threads)
                 if probe is not None else None)
    speed = (estimate_decode_tokens_per_second(facts.weight_bytes, bandwidth)
             if bandwidth and bandwidth > 0 and facts.format == "gguf" else None)
    fits = needed <= node.memory_bytes and bool(engines)
    if needed > node.memory_bytes:
        why = f"needs {format_size(needed)}, the node has {format_size(node.memory_bytes)}"
    elif not engines:
        why = "its agent cannot install an engine for it"
    elif speed is None:
        why = "fits; no speed estimate: " + ("its agent has not probed its memory bandwidth" if bandwidth is None
                                             else "the estimator is llama.cpp's, for a GGUF")
    else:
        why = f"fits; about {speed:.0f} tokens/s with {threads} thread(s)"
    return CpuNodeFit(node.node_id, node.memory_bytes, fits, threads, bandwidth, speed, engines, why)


def plan_model(facts: ModelFacts, fleet: Fleet, context: int | None = None) -> ModelFit:
    """Where `facts`' model fits in `fleet` (see the module), counting the KV cache of `context` tokens (None:
    DEFAULT_CONTEXT, at most the model's own context length). Classes by name, CPU nodes by id; a fleet without
    GPUs (or without CPU nodes) gives none of them. Pure."""
    tokens = context if context is not None else min(DEFAULT_CONTEXT, facts.context_length or DEFAULT_CONTEXT)
    needed = facts.weight_bytes + facts.kv_bytes_per_token() * tokens
    alive = [n for n in fleet.nodes if n.alive]
    by_class: dict[str, list[NodeState]] = {}
    for node in alive:
        for name in sorted({g.gpu_class for g in node.gpus}):
            by_class.setdefault(name, []).append(node)
    classes = tuple(_class_fit(facts, name, nodes, needed) for name, nodes in sorted(by_class.items()))
    cpu_nodes = tuple(_cpu_fit(facts, n, needed) for n in sorted(alive, key=lambda n: n.node_id) if not n.gpus)
    return ModelFit(facts, tokens, needed, classes, cpu_nodes)

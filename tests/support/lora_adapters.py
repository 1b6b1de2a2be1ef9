"""Real LoRA adapters for Gemma 3 270M, made in the tests' set-up from seeded random numbers (no training, no torch):

- `write_gguf_lora(base_gguf, path)`: a GGUF LoRA as llama.cpp's `convert_lora_to_gguf.py` writes one (llama.cpp
  b11434): `general.type` "adapter", `general.architecture` the base's, `adapter.type` "lora", `adapter.lora.alpha`;
  per adapted tensor `<base tensor name>.lora_a` (numpy shape (rank, n_in), so ggml ne [n_in, rank]) and
  `.lora_b` ((n_out, rank)), which `src/llama-adapter.cpp` checks against the base tensor's [n_in, n_out];
- `write_peft_lora(hf_model_dir, directory)`: a PEFT adapter as `peft`'s `save_pretrained` writes one:
  `adapter_config.json` (peft_type LORA, r, lora_alpha, target_modules) and `adapter_model.safetensors` with
  `base_model.model.model.layers.<i>.<module path>.lora_A.weight` ((rank, n_in)) and `.lora_B.weight`
  ((n_out, rank)), which vLLM's LoRA loader reads for the converted Hugging Face Gemma.

Both adapt the attention output and MLP down projections of every layer with small rank and a fixed seed: the
delta is large enough that greedy (temperature 0) output changes and small enough that it stays fluent and
stable (`STRENGTH`), and the same seed gives the same bytes.
Each returns the file's (or files') sha256 for the catalog.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np

LORA_DTYPE = "F16"
"""The GGUF LoRA's tensor type (convert_lora_to_gguf.py's `--outtype f16`). Its default F32 made llama-server b11434
on this CPU build crash at its warm-up decode (SIGSEGV, a null kernel in ggml_compute_forward_mul_mat) when one
adapter held F32 pairs for both attn_output and ffn_down (either alone loaded); the same adapter in F16 loads and
serves."""
GGUF_TARGETS = ("attn_output", "ffn_down")
"""llama.cpp's names of the adapted tensors (`blk.<i>.<name>.weight`)."""
PEFT_TARGETS = {"o_proj": "self_attn.o_proj", "down_proj": "mlp.down_proj"}
"""PEFT target module -> its path under `model.layers.<i>` in the Hugging Face Gemma 3."""
STRENGTH = 0.05
"""The spread of B's entries. Measured on llama-server with Gemma 270M (rank 4, both targets, 16 greedy tokens):
0.02 to 0.1 give fluent text that differs from the base model's and is the same whatever requests came before;
0.2 and above give token salad, whose greedy choice flips with tiny numeric differences (a prompt computed in
one batch or reused from a slot's cache), so it is not deterministic across request orders."""


def _delta_pair(rng: np.random.Generator, n_in: int, n_out: int, rank: int, strength: float):
    """(A of shape (rank, n_in), B of shape (n_out, rank)), float32, with B @ A of about `strength` per entry."""
    a = rng.standard_normal((rank, n_in)).astype(np.float32) / np.sqrt(n_in)
    b = rng.standard_normal((n_out, rank)).astype(np.float32) * strength
    return a, b


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def gguf_layout(path: Path) -> tuple[str, dict[str, list[int]]]:
    """(general.architecture, {tensor name: ggml shape [ne0, ne1, ...]}) of a GGUF v2/v3 file, from its header.

    A reader of the header alone (gguf's own GGUFReader decodes every metadata array into numpy first: 40 s for
    Gemma's 262,144-token vocabulary here). Format: ggml's docs/gguf.md (little-endian)."""
    with path.open("rb") as f:
        def take(fmt: str):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

        def string() -> str:
            return f.read(take("Q")).decode()

        def skip(kind: int) -> None:
            if kind == 8:
                f.seek(take("Q"), 1)
            elif kind == 9:
                item, count = take("I"), take("Q")
                if item in _SCALAR:
                    f.seek(struct.calcsize("<" + _SCALAR[item]) * count, 1)
                else:
                    for _ in range(count):
                        skip(item)
            else:
                f.seek(struct.calcsize("<" + _SCALAR[kind]), 1)

        assert f.read(4) == b"GGUF" and take("I") in (2, 3)
        tensors, keys = take("Q"), take("Q")
        arch = ""
        for _ in range(keys):
            key, kind = string(), take("I")
            if key == "general.architecture":
                arch = string()
            else:
                skip(kind)
        shapes = {}
        for _ in range(tensors):
            name = string()
            shapes[name] = [take("Q") for _ in range(take("I"))]
            take("I"), take("Q")  # type, offset
    return arch, shapes


def write_gguf_lora(base_gguf: Path, path: Path, *, rank: int = 4, seed: int = 0, strength: float = STRENGTH) -> str:
    """Write a GGUF LoRA for the model in `base_gguf` at `path`; return its sha256 (see the module)."""
    import gguf

    arch, shapes = gguf_layout(base_gguf)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))  # scale alpha / rank = 1
    layer = 0
    while f"blk.{layer}.attn_output.weight" in shapes:
        for target in GGUF_TARGETS:
            name = f"blk.{layer}.{target}.weight"
            n_in, n_out = shapes[name]
            a, b = _delta_pair(rng, n_in, n_out, rank, strength)
            writer.add_tensor(f"{name}.lora_a", a.astype(np.float16))  # F32 crashes b11434 on CPU: see LORA_DTYPE
            writer.add_tensor(f"{name}.lora_b", b.astype(np.float16))
        layer += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sha256_of(path)


def write_peft_lora(hf_model_dir: Path, directory: Path, *, rank: int = 4, seed: int = 0,
                    strength: float = STRENGTH) -> dict[str, str]:
    """Write a PEFT LoRA adapter for the Hugging Face model in `hf_model_dir` into `directory`; return
    {file name: sha256} of its two files (see the module)."""
    from safetensors.numpy import save_file

    config = json.loads((hf_model_dir / "config.json").read_text())
    config = config.get("text_config", config)
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    attention = config["num_attention_heads"] * config.get("head_dim", hidden // config["num_attention_heads"])
    sizes = {"o_proj": (attention, hidden), "down_proj": (inner, hidden)}
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, where in PEFT_TARGETS.items():
            a, b = _delta_pair(rng, *sizes[module], rank, strength)
            prefix = f"base_model.model.model.layers.{layer}.{where}"
            tensors[f"{prefix}.lora_A.weight"] = a
            tensors[f"{prefix}.lora_B.weight"] = b
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    (directory / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank, "lora_dropout": 0.0,
        "target_modules": sorted(PEFT_TARGETS), "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
        "use_dora": False, "modules_to_save": None, "base_model_name_or_path": str(hf_model_dir),
    }, indent=2))
    return {name: sha256_of(directory / name) for name in ("adapter_config.json", "adapter_model.safetensors")}

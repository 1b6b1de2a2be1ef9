"""What a model's files say about it before its weights are fetched: a GGUF file's header, a safetensors file's
JSON header and a Hugging Face `config.json` (pure: bytes in, `ModelFacts` out).

- GGUF (ggml's `docs/gguf.md`, version 2 and 3, little-endian): magic `GGUF`, u32 version, u64 tensor count, u64
  key/value count, the key/values (u64-length strings, typed values, typed arrays), then one record per tensor
  (name, u32 dimensions, u64 each, u32 ggml type, u64 offset). The header ends there; the weights follow. Type
  numbers are ggml's `enum ggml_type` (`ggml/include/ggml.h`), block sizes its `ggml_type_traits`. Arrays (the
  tokenizer's vocabulary: most of a header) are skipped, only their length kept.
- safetensors (huggingface/safetensors' format): u64 little-endian N, then N bytes of JSON `{"<tensor>": {"dtype",
  "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`.
- `config.json` (transformers' `PretrainedConfig`): `architectures`, `model_type`, `torch_dtype`, `num_hidden_layers`,
  `num_key_value_heads`, `num_attention_heads`, `head_dim` or `hidden_size`, `max_position_embeddings`,
  `quantization_config.quant_method`; a multimodal model's `text_config` holds them for its language model.

A header read from a prefix of the file raises `NeedMoreBytes(at_least)` when the prefix ends inside it, so a
reader asks for more with a Range request (`llmgw.agent.model_metadata`). Anything else wrong raises ParseError.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from llmgw.tools.values import ParseError

GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}
"""ggml type number -> (name, elements per block, bytes per block)."""
SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                      "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
"""safetensors dtype -> bytes per element."""
MAX_HEADER_BYTES = 256 << 20
"""The largest header read (a GGUF header with a 256k-token vocabulary is about 6 MB)."""

# GGUF value types (gguf.md `gguf_metadata_value_type`) -> struct format; 8 string, 9 array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class NeedMoreBytes(Exception):
    """The bytes given end inside the header: read at least `at_least` bytes from the file's start."""

    def __init__(self, at_least: int):
        super().__init__(f"the header needs at least {at_least} bytes")
        self.at_least = at_least


@dataclass(frozen=True)
class Quantisation:
    """The tensors of one type (a ggml type "Q4_K", a safetensors dtype "BF16"): how many, their bytes."""

    type: str
    tensors: int
    bytes: int


@dataclass(frozen=True)
class ModelFacts:
    """What a model's metadata says. `format` "gguf" or "safetensors"; `architecture` GGUF's
    `general.architecture` or config.json's first `architectures` entry ("" unknown); `weight_bytes` the files'
    sizes together (what a token reads on a CPU: `llmgw.plan.cpu_speed`); `parameters` the tensors' elements;
    `quantisations` by bytes, largest first; `file_type` the quantisation the file is named by ("Q4_K_M", "BF16";
    "" unknown). For the KV cache: `layers`, `kv_heads`, `head_dim` and `context_length` (0 unknown). `header_bytes`
    what was read of the files to learn this; `sha256` the file's digest when the server published it (the Hub's
    `X-Linked-Etag` of an LFS file; "" otherwise)."""

    source: str
    format: str
    architecture: str
    name: str
    weight_bytes: int
    parameters: int
    quantisations: tuple[Quantisation, ...]
    file_type: str = ""
    layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    context_length: int = 0
    files: int = 1
    header_bytes: int = 0
    sha256: str = ""

    def kv_bytes_per_token(self) -> int:
        """The f16 KV cache of one token (keys and values of every layer); 0 when the metadata does not say."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "format": self.format, "architecture": self.architecture, "name": self.name,
                "weight_bytes": self.weight_bytes, "parameters": self.parameters, "file_type": self.file_type,
                "quantisations": [{"type": q.type, "tensors": q.tensors, "bytes": q.bytes}
                                  for q in self.quantisations],
                "layers": self.layers, "kv_heads": self.kv_heads, "head_dim": self.head_dim,
                "context_length": self.context_length, "files": self.files, "header_bytes": self.header_bytes,
                "sha256": self.sha256}


class _Cursor:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, size: int) -> bytes:
        end = self.at + size
        if end > len(self.data):
            if end > MAX_HEADER_BYTES:
                raise ParseError("gguf", f"the header claims more than {MAX_HEADER_BYTES} bytes; not a GGUF file")
            raise NeedMoreBytes(max(end, len(self.data) * 2))
        chunk = self.data[self.at:end]
        self.at = end
        return chunk

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def skip_strings(self, count: int) -> None:
        data, at, size = self.data, self.at, len(self.data)
        for _ in range(count):
            if at + 8 > size:
                self.at = at
                self.take(8)
            at += 8 + int.from_bytes(data[at:at + 8], "little")
        self.at = min(at, size)
        self.take(at - self.at)

    def string(self) -> str:
        return self.take(self.unpack("<Q")).decode("utf-8", "replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == 8:
            return self.string()
        if kind == 9:
            inner, count = self.unpack("<I"), self.unpack("<Q")
            if inner in _SCALARS:  # skipped, not decoded: a vocabulary's scores are 262k floats
                self.take(struct.calcsize(_SCALARS[inner]) * count)
            elif inner == 8:  # a vocabulary's tokens: their lengths stepped over, nothing decoded
                self.skip_strings(count)
            else:
                for _ in range(count):
                    self.value(inner)
            return count
        raise ParseError("gguf", f"value type {kind} at byte {self.at} is none of gguf.md's")


_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
               11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
               18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
               25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
               32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE"}
"""`general.file_type` (llama.cpp's `enum llama_ftype`) -> the name llama-quantize gives it."""


def _quantisations(counts: Mapping[str, tuple[int, int]]) -> tuple[Quantisation, ...]:
    return tuple(sorted((Quantisation(t, n, b) for t, (n, b) in counts.items()), key=lambda q: (-q.bytes, q.type)))


def parse_gguf_header(data: bytes, source: str, file_bytes: int) -> ModelFacts:
    """The facts of the GGUF file `source` of `file_bytes` bytes from a prefix `data` of it.

    Raises NeedMoreBytes(n) when `data` ends inside the header (read n bytes from the start and call again);
    ParseError when it is not GGUF version 2 or 3, or a tensor has a type ggml does not define."""
    cursor = _Cursor(data)
    if cursor.take(4) != b"GGUF":
        raise ParseError("gguf", f"{source} does not begin with the GGUF magic; not a GGUF file", text=repr(data[:8]))
    version = cursor.unpack("<I")
    if version not in (2, 3):
        raise ParseError("gguf", f"{source} is GGUF version {version}; this reader knows versions 2 and 3")
    tensors, keys = cursor.unpack("<Q"), cursor.unpack("<Q")
    meta: dict[str, Any] = {}
    for _ in range(keys):
        key = cursor.string()
        meta[key] = cursor.value(cursor.unpack("<I"))
    counts: dict[str, tuple[int, int]] = {}
    parameters = 0
    for _ in range(tensors):
        cursor.string()
        dims = [cursor.unpack("<Q") for _ in range(cursor.unpack("<I"))]
        kind = cursor.unpack("<I")
        cursor.unpack("<Q")
        if kind not in GGML_TYPES:
            raise ParseError("gguf", f"{source}: a tensor has ggml type {kind}, which this reader does not know")
        name, block, block_bytes = GGML_TYPES[kind]
        elements = math.prod(dims)
        parameters += elements
        n, b = counts.get(name, (0, 0))
        counts[name] = (n + 1, b + elements // block * block_bytes)
    arch = str(meta.get("general.architecture", ""))

    def number(key: str) -> int:
        value = meta.get(f"{arch}.{key}")
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0

    heads, kv_heads = number("attention.head_count"), number("attention.head_count_kv")
    head_dim = number("attention.key_length") or (number("embedding_length") // heads if heads else 0)
    file_type = meta.get("general.file_type")
    return ModelFacts(source, "gguf", arch, str(meta.get("general.name", "")), file_bytes, parameters,
                      _quantisations(counts), _FILE_TYPES.get(file_type, "") if isinstance(file_type, int) else "",
                      number("block_count"), kv_heads or heads, head_dim, number("context_length"),
                      header_bytes=cursor.at)


def safetensors_header_length(data: bytes, source: str) -> int:
    """The bytes of the safetensors header (8 + N) from at least its first 8 bytes. Raises NeedMoreBytes(8) for
    fewer, ParseError for a length past MAX_HEADER_BYTES."""
    if len(data) < 8:
        raise NeedMoreBytes(8)
    length = struct.unpack("<Q", data[:8])[0]
    if length > MAX_HEADER_BYTES:
        raise ParseError("safetensors", f"{source} claims a {length}-byte header; not a safetensors file")
    return 8 + length


def parse_safetensors_header(data: bytes, source: str, file_bytes: int) -> ModelFacts:
    """The facts of one safetensors file (`file_bytes` bytes) from a prefix `data` holding its header.

    Raises NeedMoreBytes when `data` is shorter than the header, ParseError when the header is not the format's
    JSON (naming the tensor) or a dtype is unknown."""
    end = safetensors_header_length(data, source)
    if len(data) < end:
        raise NeedMoreBytes(end)
    try:
        header = json.loads(data[8:end])
    except ValueError as exc:
        raise ParseError("safetensors", f"{source}: the header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise ParseError("safetensors", f"{source}: the header is not a JSON object")
    counts: dict[str, tuple[int, int]] = {}
    parameters = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        dtype = tensor.get("dtype") if isinstance(tensor, dict) else None
        shape = tensor.get("shape") if isinstance(tensor, dict) else None
        if dtype not in SAFETENSORS_DTYPES or not isinstance(shape, list) \
                or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ParseError("safetensors", f"{source}: tensor {name!r} has no known dtype and shape "
                                            f"(dtype {dtype!r})")
        elements = math.prod(shape)
        parameters += elements
        n, b = counts.get(dtype, (0, 0))
        counts[dtype] = (n + 1, b + elements * SAFETENSORS_DTYPES[dtype])
    return ModelFacts(source, "safetensors", "", "", file_bytes, parameters, _quantisations(counts),
                      header_bytes=end)


def combined(source: str, parts: list[ModelFacts], config: Mapping[str, Any] | None) -> ModelFacts:
    """The facts of a repository of several safetensors files `parts` and its `config.json` (None: none), as one
    model named `source`. Raises ParseError for no parts."""
    if not parts:
        raise ParseError("safetensors", f"{source} holds no .safetensors file")
    counts: dict[str, tuple[int, int]] = {}
    for part in parts:
        for q in part.quantisations:
            n, b = counts.get(q.type, (0, 0))
            counts[q.type] = (n + q.tensors, b + q.bytes)
    facts = ModelFacts(source, "safetensors", "", "", sum(p.weight_bytes for p in parts),
                       sum(p.parameters for p in parts), _quantisations(counts), files=len(parts),
                       header_bytes=sum(p.header_bytes for p in parts))
    return with_config(facts, config or {})


def with_config(facts: ModelFacts, config: Mapping[str, Any]) -> ModelFacts:
    """`facts` completed from a Hugging Face `config.json` (its `text_config` first, for a multimodal model)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else {}

    def number(key: str) -> int:
        value = text.get(key, config.get(key))
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    architectures = config.get("architectures")
    architecture = str(architectures[0]) if isinstance(architectures, list) and architectures else \
        str(config.get("model_type", ""))
    heads = number("num_attention_heads")
    head_dim = number("head_dim") or (number("hidden_size") // heads if heads else 0)
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, Mapping) else None
    dtype = str(text.get("torch_dtype") or config.get("torch_dtype") or config.get("dtype") or "")
    return replace(facts, architecture=architecture, name=str(config.get("_name_or_path", "")) or facts.name,
                   file_type=str(method or dtype or facts.file_type), layers=number("num_hidden_layers"),
                   kv_heads=number("num_key_value_heads") or heads, head_dim=head_dim,
                   context_length=number("max_position_embeddings"))

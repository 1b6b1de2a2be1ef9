"""What makes a model's LoRA adapters loadable by its engine: the checks `llmgw validate` makes of `adapters:`.

Pure: a `Model` in, a list of (key path, message) out; `llmgw.settings.building` places each at its file and line.
The rules follow what each engine loads:

- llama.cpp (`--lora FILE`, llama.cpp's `src/llama-adapter.cpp`): one GGUF file per adapter (written by
  llama.cpp's `convert_lora_to_gguf.py`: `general.type` adapter, `adapter.type` lora);
- vLLM (`--lora-modules name=DIR`, vLLM's `PEFTHelper`): a PEFT adapter's directory, so the files must hold an
  `adapter_config.json` and its weights `adapter_model.safetensors` (`adapter_model.bin` only with `allow_pickle`);
- SGLang could load PEFT adapters (`--lora-paths`), but llmgw does not give it any yet, and a model served by
  `endpoints` runs no engine of llmgw's: both are refused rather than silently ignored.

Names (clashes with model names, aliases and other adapters) are checked with the catalog's other names, in
`building.check_names`.
"""

from __future__ import annotations

from llmgw.settings.model import Model

ADAPTER_ENGINES = ("llama.cpp", "vllm")
"""Engines llmgw gives LoRA adapters to."""
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
"""The names a PEFT adapter's weights have (`peft.utils.constants.SAFETENSORS_WEIGHTS_NAME`, `WEIGHTS_NAME`)."""

Problem = tuple[tuple[str | int, ...], str]


def _file_name(source: str) -> str:
    """The last path component of a weights source ("hf://o/r@rev/dir/adapter_config.json" -> "adapter_config.json")."""
    return source.rstrip("/").rsplit("/", 1)[-1]


def adapter_problems(model: Model) -> list[Problem]:
    """Why `model`'s adapters cannot be served as written: [(key path, sentence), ...], empty when they can.

    Refused: adapters on an engine llmgw gives none (SGLang) or on an `endpoints` model (at `adapters`); for
    llama.cpp, an adapter whose files are not exactly one `.gguf`; for vLLM, one without `adapter_config.json` or
    without `adapter_model.safetensors` (or `.bin`), or with two files of one name (at `adapters[i].weights`).
    """
    if not model.adapters:
        return []
    if model.endpoints:
        return [(("adapters",), f"model {model.name!r} is served by endpoints, where llmgw runs no engine to load "
                                "adapters into; drop adapters, or list each adapter's server as a model of its own")]
    if model.engine not in ADAPTER_ENGINES:
        return [(("adapters",), f"llmgw gives {model.engine} no LoRA adapters yet (it does for "
                                f"{' and '.join(ADAPTER_ENGINES)}); serve the model with one of those, or drop "
                                "adapters")]
    problems: list[Problem] = []
    for index, adapter in enumerate(model.adapters):
        where = ("adapters", index, "weights")
        if any(w.is_directory for w in adapter.weights):
            continue  # refused by name where the weights are checked (`building.check_files`' caller)
        names = [_file_name(w.source) for w in adapter.weights]
        if model.engine == "llama.cpp":
            if len(names) != 1 or not names[0].endswith(".gguf"):
                problems.append((where, f"llama.cpp loads a LoRA adapter from one GGUF file (convert_lora_to_gguf.py "
                                        f"writes it), but adapter {adapter.name!r} lists {', '.join(names)}; "
                                        "list its .gguf file alone"))
            continue
        twice = sorted({n for n in names if names.count(n) > 1})
        missing = [n for n, present in ((PEFT_CONFIG, PEFT_CONFIG in names),
                                        (PEFT_WEIGHTS[0], any(n in names for n in PEFT_WEIGHTS))) if not present]
        if twice:
            problems.append((where, f"adapter {adapter.name!r} lists {', '.join(twice)} twice; vLLM reads one "
                                    "directory, where each name is one file"))
        elif missing:
            problems.append((where, f"vLLM loads a PEFT adapter's directory, but adapter {adapter.name!r} lacks "
                                    f"{' and '.join(missing)}; list the adapter's {PEFT_CONFIG} and "
                                    f"{PEFT_WEIGHTS[0]} with their sha256"))
    return problems

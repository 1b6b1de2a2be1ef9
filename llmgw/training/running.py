"""The agent's side of a training job: the training process, its progress, the GGUF conversion, the pieces.

`train(python, job, base, workdir, on_event)` runs `train_lora.py` with the training venv's `python` and hands each
progress line (`parse_event`) to `on_event` as it comes; the adapter lands in `<workdir>/adapter/`. Cancelling the
caller's scope kills the process. `convert_to_gguf(python, converter, base, adapter_dir, out)` runs llama.cpp's own
`convert_lora_to_gguf.py` (`llmgw.training.environment.find_converter`) with `--outtype f16` (an F32 LoRA crashed
llama-server b11434 on this CPU build: tests/support/lora_adapters.py, LORA_DTYPE); for another engine
`pack_peft` puts PEFT's two files in one tar. `pieces(data)` cuts the adapter
file into `PIECE_BYTES` pieces for the wire. Each raises EngineError with the process's last lines when it fails.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from llmgw.errors import EngineError
from llmgw.training.jobs import TrainingJob

SCRIPT = Path(__file__).with_name("train_lora.py")
PIECE_BYTES = 512 * 1024
"""Bytes of one TrainingPiece (well under the wire's message limit; the store keeps each as one value)."""
_TAIL = 15
TRAINING_THREADS = 2
"""torch's threads (`OMP_NUM_THREADS`) in a training process unless the agent says otherwise
(`AgentConfig.training_threads`). On a 2-core machine whose cores are busy with other work, 1 is several times faster:
torch's OpenMP threads wait for each other at every operation when one is off its core (Gemma 3 270M, 4 steps of 2
pairs at a load average of 8: 1.4 s of steps with 1 thread, 31-53 s with 2)."""


def parse_event(line: str) -> dict[str, Any] | None:
    """The progress event of one stdout line of `train_lora.py` (a JSON object with "event"), else None (a line of
    a library's own). Pure."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("event"), str) else None


def pieces(data: bytes, size: int = PIECE_BYTES) -> list[bytes]:
    """`data` cut into pieces of `size` bytes (the last shorter; one empty piece for no data). Pure."""
    return [data[i:i + size] for i in range(0, len(data), size)] or [b""]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _run(argv: list[str], what: str, on_line: Callable[[str], None], cwd: Path, env: dict | None = None) -> None:
    """Run `argv`, each stdout line to `on_line`, stderr kept for the failure's sentence. Raises EngineError."""
    tail: deque[str] = deque(maxlen=_TAIL)
    async with trio.open_nursery() as nursery:
        process = await nursery.start(lambda task_status: trio.run_process(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False, cwd=str(cwd), env=env,
            task_status=task_status))
        buffer = b""
        async for chunk in process.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace")
                if parse_event(line) is None and line.strip():
                    tail.append(line)
                on_line(line)
        await process.wait()
    if process.returncode != 0:
        said = "\n".join(tail)
        raise EngineError(f"{what} failed (exit {process.returncode}):\n{said}")


async def train(python: Path, job: TrainingJob, base: Path, workdir: Path,
                on_event: Callable[[dict[str, Any]], None], *, threads: int = TRAINING_THREADS) -> Path:
    """Train `job`'s adapter on `base` with `python` (see the module's docstring) on `threads` threads; returns the
    adapter's directory. Raises EngineError when the training process fails."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "job.json").write_text(job.to_json())
    out = workdir / "adapter"

    def on_line(line: str) -> None:
        event = parse_event(line)
        if event is not None:
            on_event(event)

    await _run([str(python), "-I", str(SCRIPT), str(workdir / "job.json"), str(base), str(out)],
               "the training process", on_line, workdir,
               env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                    "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"})
    if not (out / "adapter_model.safetensors").is_file():
        raise EngineError(f"the training process ended without writing {out / 'adapter_model.safetensors'}")
    return out


PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""The files of a PEFT adapter a catalog entry names for vLLM (docs/engines.md, LoRA adapters)."""


def pack_peft(adapter_dir: Path, out: Path) -> Path:
    """`PEFT_FILES` of `adapter_dir` in one uncompressed tar at `out` (the adapter sent for an engine other than
    llama.cpp; `llmgw train get` unpacks it). Blocking. Raises EngineError when a file is missing."""
    with tarfile.open(out, "w") as tar:
        for name in PEFT_FILES:
            if not (adapter_dir / name).is_file():
                raise EngineError(f"the training process wrote no {adapter_dir / name}")
            tar.add(adapter_dir / name, arcname=name)
    return out


async def convert_to_gguf(python: Path, converter: Path, base: Path, adapter_dir: Path, out: Path) -> Path:
    """The adapter in `adapter_dir` converted to a GGUF LoRA at `out` by llama.cpp's `converter` script, run with
    `python` (its own `gguf-py` beside it). Raises EngineError when the conversion fails."""
    await _run([str(python), "-E", "-s", str(converter), "--base", str(base), "--outtype", "f16", "--outfile",
                str(out), str(adapter_dir)], f"converting the adapter to GGUF ({converter.name})",
               lambda line: None, adapter_dir.parent,
               env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    if not out.is_file():
        raise EngineError(f"{converter.name} ended without writing {out}")
    return out

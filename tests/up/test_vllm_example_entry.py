"""The example catalog's gemma-3-270m-vllm without starting vLLM: it pins exactly the files `make vllm` converts and
mirrors, it stays at `replicas: 0` (so `make up` needs no vLLM), and before `make vllm` has run `llmgw up`'s status
line for its replica says what to run. The entry served for real: tests/up/test_vllm_through_up.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.weights_layout import repository_path
from llmgw.cli.up_cmd import _replica_lines, needs_make_vllm
from llmgw.engines.demo import GEMMA_SHA256
from llmgw.engines.vllm_demo import DEMO_VLLM_VERSION, GEMMA_HF_FILES, fill_mirror
from llmgw.errors import WeightsError
from llmgw.settings import load_directory

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"
MODEL = "gemma-3-270m-vllm"


def test_the_entry_pins_the_files_make_vllm_converts_and_is_not_served_until_raised():
    settings = load_directory(EXAMPLE)
    model = settings.models[MODEL]
    assert (model.engine, model.engine_version, model.replicas) == ("vllm", DEMO_VLLM_VERSION, 0)
    assert {repository_path(f.source): f.sha256 for f in model.weights} == GEMMA_HF_FILES
    assert ("vllm", DEMO_VLLM_VERSION) in settings.engines
    demo = settings.projects["demo"]  # `llmgw up`'s first key may use it once it serves
    assert MODEL in demo.models


def test_before_make_vllm_its_replica_line_says_what_to_run():
    settings = load_directory(EXAMPLE)
    assert needs_make_vllm(settings, vllm_ready=False) == {MODEL}
    assert needs_make_vllm(settings, vllm_ready=True) == frozenset()
    doc = {"replicas": {
        f"{MODEL}-0": {"model": MODEL, "state": "starting", "node": "node01", "shards": {}},
        "gemma-3-270m-0": {"model": "gemma-3-270m", "state": "ready", "node": "node01", "shards": {}},
    }}
    lines = _replica_lines(doc, needs_make_vllm(settings, vllm_ready=False))
    assert "run `make vllm`" in lines[f"{MODEL}-0"] and "then `llmgw restart`" in lines[f"{MODEL}-0"]
    assert "make vllm" not in lines["gemma-3-270m-0"]
    assert "make vllm" not in _replica_lines(doc, needs_make_vllm(settings, vllm_ready=True))[f"{MODEL}-0"]


def test_a_conversion_that_gives_other_bytes_is_not_mirrored_and_says_what_to_do(tmp_path):
    cache = tmp_path / "cache"
    (cache / "mirror" / "sha256").mkdir(parents=True)
    (cache / "mirror" / "sha256" / GEMMA_SHA256).write_bytes(b"")  # the GGUF's place: not assembled here
    converted = tmp_path / "converted"
    converted.mkdir()
    for name in GEMMA_HF_FILES:
        (converted / name).write_text("other bytes\n")
    with pytest.raises(WeightsError, match=r"pins [0-9a-f]{64}; delete .* and run `make vllm` again"):
        fill_mirror(cache, converted)
    assert sorted(p.name for p in (cache / "mirror" / "sha256").iterdir()) == [GEMMA_SHA256]

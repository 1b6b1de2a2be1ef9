"""A catalog model whose weights are a Hugging Face repository directory pinned to a revision: `llmgw validate`
accepts it (with or without the digest of the whole set) and the settings carry it as a directory source."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.settings import load_directory
from llmgw.settings.model import WeightsFile
from settings_trees import copy_example

REV = "0123456789abcdef0123456789abcdef01234567"
MODEL = """engine: vllm
weights:
  - source: {source}
{digest}replicas: 0
resources:
  cpu_cores: 1
  memory: 1Gi
"""


def tree_with(tmp_path: Path, source: str, digest: str = "") -> Path:
    tree = copy_example(tmp_path / "settings")
    (tree / "catalog" / "tiny.yaml").write_text(
        MODEL.format(source=source, digest=f"    sha256: {digest}\n" if digest else ""))
    return tree


@pytest.mark.parametrize(("source", "digest"), [
    (f"hf://acme/tiny-llm@{REV}/", ""),
    (f"hf://acme/tiny-llm@{REV}/checkpoint/", "c" * 64),
    (f"hf://acme/tiny-llm@{REV}/checkpoints/step-100/", ""),
])
def test_a_pinned_directory_source_is_accepted_and_read_as_one(tmp_path: Path, source: str, digest: str) -> None:
    tree = tree_with(tmp_path, source, digest)
    result = CliRunner().invoke(cli, ["validate", str(tree)])
    assert result.exit_code == 0, result.output
    assert "tiny.yaml" not in result.output  # neither an error nor a warning about it
    weights = load_directory(tree).models["tiny"].weights
    assert weights == (WeightsFile(source, digest, REV),) and weights[0].is_directory


@pytest.mark.parametrize(("source", "reason"), [
    ("hf://acme/tiny-llm/", "a directory source is a Hugging Face repository directory pinned to a commit"),
    ("hf://acme/tiny-llm/checkpoint/", "a directory source is a Hugging Face repository directory pinned to a commit"),
    ("hf://acme/tiny-llm@main/", "is not a weights source"),
    (f"hf://acme/tiny-llm@{REV[:12]}/", "is not a weights source"),
    ("https://example.com/models/tiny/", "a directory source is a Hugging Face repository directory"),
])
def test_a_directory_source_not_pinned_to_a_commit_is_refused_at_its_line(tmp_path: Path, source: str,
                                                                          reason: str) -> None:
    result = CliRunner().invoke(cli, ["validate", str(tree_with(tmp_path, source))])
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("catalog/tiny.yaml")]
    assert len(errors) == 1 and errors[0].startswith("catalog/tiny.yaml:3:13: weights[0].source: ")
    assert reason in errors[0] and "40-hex revision>/" in errors[0], result.output

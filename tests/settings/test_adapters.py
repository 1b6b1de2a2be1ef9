"""LoRA adapters in the catalog: read into the settings, allowed per project by their own names, no longer warned as
not acted on, and part of what a replica runs (changing them restarts replicas; prices do not)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.plan.identity import fingerprint
from llmgw.settings import load_directory
from llmgw.settings.model import Adapter, WeightsFile
from settings_trees import copy_example

REV = "0123456789abcdef0123456789abcdef01234567"
PIRATE = WeightsFile(f"hf://org/pirate-lora@{REV}/pirate.gguf", "a" * 64, REV)
ADAPTERS = f"""adapters:
  - name: gemma-pirate
    weights:
      - source: {PIRATE.source}
        sha256: {PIRATE.sha256}
  - name: gemma-poet
    weights:
      - source: file:///srv/loras/poet.gguf
        sha256: {"b" * 64}
"""


def tree_with_adapters(tmp_path: Path) -> Path:
    tree = copy_example(tmp_path / "settings")
    gemma = tree / "catalog" / "gemma-3-270m.yaml"
    gemma.write_text(gemma.read_text() + ADAPTERS)
    projects = tree / "projects.yaml"
    projects.write_text(projects.read_text().replace("models: [gemma]      #", "models: [gemma-pirate] #"))
    return tree


def test_adapters_are_read_in_catalog_order_and_a_project_may_name_one(tmp_path: Path) -> None:
    settings = load_directory(tree_with_adapters(tmp_path))
    gemma = settings.models["gemma-3-270m"]
    assert gemma.adapters == (Adapter("gemma-pirate", (PIRATE,)),
                              Adapter("gemma-poet", (WeightsFile("file:///srv/loras/poet.gguf", "b" * 64),)))
    assert settings.projects["ci"].models == ("gemma-pirate",)


def test_validate_accepts_adapters_without_a_not_acted_on_warning(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["validate", str(tree_with_adapters(tmp_path))])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if "warning:" in line]
    assert not [w for w in warnings if "adapters" in w or "not acted on" in w], result.output
    assert len(warnings) == 1 and "weights[0].source: warning: pinned by sha256 alone" in warnings[0]  # the example's


def test_an_adapter_pinned_by_sha256_alone_is_warned_about_at_its_line(tmp_path: Path) -> None:
    tree = tree_with_adapters(tmp_path)
    gemma = tree / "catalog" / "gemma-3-270m.yaml"
    gemma.write_text(gemma.read_text().replace(f"@{REV}/pirate.gguf", "/pirate.gguf"))
    result = CliRunner().invoke(cli, ["validate", str(tree)])
    assert result.exit_code == 0, result.output
    assert "catalog/gemma-3-270m.yaml:41:17: adapters[0].weights[0].source: warning: pinned by sha256 alone" \
        in result.output


def test_changing_adapters_changes_what_a_replica_runs_and_prices_do_not(tmp_path: Path) -> None:
    gemma = load_directory(tree_with_adapters(tmp_path)).models["gemma-3-270m"]
    pirate, poet = gemma.adapters
    base = fingerprint(gemma, "b11434")
    other_file = replace(pirate, weights=(replace(PIRATE, sha256="c" * 64),))
    changed = [
        replace(gemma, adapters=()),                      # removed
        replace(gemma, adapters=(poet, pirate)),          # reordered: llama.cpp numbers adapters by position
        replace(gemma, adapters=(replace(pirate, name="gemma-corsair"), poet)),  # renamed
        replace(gemma, adapters=(other_file, poet)),      # another file
    ]
    prints = {fingerprint(model, "b11434") for model in changed}
    assert base not in prints and len(prints) == len(changed)
    assert fingerprint(replace(gemma, prices=replace(gemma.prices, prompt_per_million=9.0)), "b11434") == base

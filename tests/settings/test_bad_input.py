"""Every tree of the bad-input corpus (tests/settings/bad/<case>/, laid over the example repository) gives
`llmgw validate` exit 1, the right `file:line`, exactly one error, and never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from settings_trees import BAD, copy_example, overlay

# case -> (where: "file:line" or "file:" for whole-file faults, a fragment of the reason)
CASES = {
    "wrong-type": ("catalog/m.yaml:5:11", "'three' is not of type 'integer'"),
    "unknown-key": ("catalog/m.yaml:9:1", "unknown key 'replcas'"),
    "bad-unit": ("catalog/m.yaml:8:11", "'1Gx' is not a size"),
    "negative-number": ("catalog/m.yaml:5:11", "replicas: -1 is less than the minimum of 0"),
    "huge-number": ("catalog/m.yaml:5:11", "greater than the maximum of 1024"),
    "unknown-engine": ("catalog/m.yaml:1:9", "'llama' is not one of"),
    "unknown-routing": ("catalog/m.yaml:9:10", "'random' is not one of ['prefix', 'least-loaded', 'round-robin', 'expected-time']"),
    "duplicate-key": ("catalog/m.yaml:9:1", "duplicate key 'replicas' (first at line 5)"),
    "tabs": ("catalog/m.yaml:8:1", "tab character"),
    "non-utf8": ("catalog/m.yaml:9:6", "byte 0xe9 is not UTF-8"),
    "yaml-bomb": ("catalog/m.yaml:16:1", "aliases expand to more than"),
    "empty-catalog-file": ("catalog/m.yaml:1:1", "file is empty"),
    "model-file-is-list": ("catalog/m.yaml:1:1", "holds a list; it must hold a mapping"),
    "python-tag": ("catalog/m.yaml:9:15", "python/object/apply:os.system' is not allowed"),
    "custom-tag": ("catalog/m.yaml:9:14", "tag '!include' is not allowed"),
    "bad-sha256": ("catalog/m.yaml:4:13", "is not a sha256 digest"),
    "bad-source": ("catalog/m.yaml:3:13", "is not a weights source"),
    "pickle-weights": ("catalog/m.yaml:3:13", "pickle format"),
    # a repository directory as a source: only on the Hub, pinned to a 40-hex revision; files keep their sha256
    "directory-unpinned": ("catalog/m.yaml:3:13", "weights[0].source: a directory source is a Hugging Face "
                           "repository directory pinned to a commit"),
    "directory-on-branch": ("catalog/m.yaml:3:13", "is not a weights source"),
    "adapter-directory-source": ("catalog/m.yaml:9:17", "an adapter lists its files one by one"),
    "file-without-sha256": ("catalog/m.yaml:4:13", "weights[1].source: a weights file needs its sha256"),
    "tp-larger-than-gpus": ("catalog/m.yaml:9:20", "= 4 is larger than the 2 GPUs asked for"),
    "gpu-without-class": ("catalog/m.yaml:7:9", "must name its resources.gpu_class"),
    "cpu-model-without-memory": ("catalog/m.yaml:7:3", "a CPU model must reserve memory"),
    "rerank-without-reranking": ("catalog/m.yaml:7:9", "llama-server reranks only when started with --reranking"),
    "tp-on-cpu-model": ("catalog/m.yaml:8:20", "needs 2 GPUs but the model asks for none"),
    "unknown-engine-version": ("catalog/m.yaml:9:17", "engines.yaml lists no version 'b9999'"),
    "alias-is-another-model": ("catalog/m.yaml:9:15", "alias 'gemma' is already the name or an alias of model 'gemma-3-270m'"),
    # LoRA adapters share the namespace of model names and aliases, and need an engine that loads them
    "adapter-named-like-a-model": ("catalog/m.yaml:12:11", "adapter 'gemma-3-270m' is already the name or an alias "
                                   "of model 'gemma-3-270m'; model names, aliases and adapter names share one namespace"),
    "adapter-named-like-an-alias": ("catalog/m.yaml:8:11", "adapter 'gemma' is already the name or an alias of model"),
    "adapter-on-sglang": ("catalog/m.yaml:7:1", "llmgw gives sglang no LoRA adapters yet"),
    "adapter-on-endpoints": ("catalog/m.yaml:4:1", "is served by endpoints, where llmgw runs no engine to load adapters"),
    "llama-cpp-adapter-not-gguf": ("catalog/m.yaml:10:7", "llama.cpp loads a LoRA adapter from one GGUF file"),
    "vllm-adapter-without-config": ("catalog/m.yaml:10:7", "lacks adapter_config.json"),
    "adapter-pickle-weights": ("catalog/m.yaml:12:17", "adapters[0].weights[1].source: weights in a pickle format"),
    "name-differs-from-file": ("catalog/m.yaml:1:7", "differs from the file name 'm'"),
    # rollout: canary (docs/review.md)
    "canary-share-above-one": ("catalog/m.yaml:7:36", "rollout.share: 1.5 is greater than the maximum of 1"),
    "canary-without-slo": ("catalog/m.yaml:8:13", "a canary needs an SLO to judge it by"),
    "canary-bad-ttft": ("catalog/m.yaml:9:19", "rollout.slo.ttft_p90: 'soon' is not a duration"),
    "canary-keys-without-canary": ("catalog/m.yaml:8:11", "read only by a canary: add strategy: canary"),
    "unknown-rollout-strategy": ("catalog/m.yaml:7:21", "'blue-green' is not a rollout strategy: write rolling or canary"),
    # replicas: {min, max} (docs/autoscaling.md)
    "autoscale-min-above-max": ("catalog/m.yaml:7:8", "replicas.min: min 3 is above max 2"),
    "autoscale-without-max": ("catalog/m.yaml:7:3", "replicas.max: missing required key 'max'"),
    "autoscale-idle-without-zero": ("catalog/m.yaml:9:9", "idle is read only when min is 0"),
    "autoscale-bad-window": ("catalog/m.yaml:9:20", "replicas.scale_up_window: 'soon' is not a duration"),
    "autoscale-unknown-key": ("catalog/m.yaml:9:3", "replicas.target: unknown key 'target'"),
    "bad-file-name": ("catalog/Big Model.yaml:", "is not a valid name"),
    "unknown-settings-file": ("projets.yaml:", "is not a settings file"),
    "yml-extension": ("catalog/m.yml:", "did you mean catalog/m.yaml?"),
    "missing-llmgw-yaml": ("llmgw.yaml:", "is missing"),
    "cluster-without-name": ("llmgw.yaml:1:1", "missing required key 'name'"),
    "bad-duration": ("llmgw.yaml:3:18", "'2 minutes' is not a duration"),
    "port-out-of-range": ("llmgw.yaml:4:11", "70000 is greater than the maximum of 65535"),
    "bad-store-kind": ("llmgw.yaml:3:9", "'mysql' is not one of ['sqlite', 'postgresql']"),
    "bad-control-plane": ("llmgw.yaml:4:5", "'10.0.0.2' is not host:port"),
    # a whole public key file pasted where its key line belongs: the base64 line alone is a key
    "bad-release-key": ("llmgw.yaml:4:7", "'untrusted comment: minisign public key 4F4B0252E7E6CE92' is not a "
                        "minisign public key: give the second line of the public key file"),
    "bad-currency": ("llmgw.yaml:3:13", "'usd' does not match"),
    "node-override-unknown-key": ("agents/nodes/n1.yaml:2:1", "unknown key 'gpu_ignore'"),
    "node-override-bad-duration": ("agents/nodes/n1.yaml:1:21", "'fast' is not a duration"),
    "agent-bad-fabric": ("agents/default.yaml:2:19", "'token-ring' is not one of"),
    "tracing-bad-endpoint": ("llmgw.yaml:3:13", "'collector:4318' is not an OTLP/HTTP URL"),
    "tracing-ratio-above-one": ("agents/nodes/n1.yaml:2:17", "2 is greater than the maximum of 1"),
    "project-unknown-model": ("projects.yaml:7:36", "unknown model 'gpt-5'"),
    "project-name-twice": ("projects.yaml:9:11", "project 'p' is also in team 't1'"),
    "project-bad-member": ("projects.yaml:7:23", "'alice' does not match"),
    "project-negative-quota": ("projects.yaml:8:31", "-5 is less than the minimum of 0"),
    "engines-two-defaults": ("engines.yaml:6:14", "several default versions"),
    "engines-bad-platform": ("engines.yaml:5:7", "'windows-x86_64' is not allowed as a key here"),
    "firewall-without-enabled": ("firewall.yaml:1:1", "missing required key 'enabled'"),
    "slurm-enabled-yes": ("slurm.yaml:1:10", "'yes please' is not of type 'boolean'"),
    "invalid-yaml": ("catalog/m.yaml:10:1", "not valid YAML"),
    # projects.yaml names gemma-3-270m and its alias "gemma": no follow-on "unknown model" error for them
    "broken-file-of-a-model-projects-use": ("catalog/gemma-3-270m.yaml:4:1", "not valid YAML"),
    "two-documents": ("catalog/m.yaml:9:1", "holds one YAML document"),
    "recursive-alias": ("catalog/m.yaml:9:14", "recursive alias"),
    "mapping-as-key": ("catalog/m.yaml:10:5", "a key must be a plain scalar"),
    "empty-catalog": ("llmgw.yaml:21:3", "the catalog holds no model"),
    "bad-gpu-class": ("catalog/m.yaml:8:14", "'H100 80G' is not a GPU class"),
    "infinite-cpu-cores": ("catalog/m.yaml:7:14", "'.inf' is not a finite number"),
    "size-beyond-64-bits": ("catalog/m.yaml:8:11", "'99999999Pi' is larger than the largest size settings take"),
    "duration-beyond-a-century": ("agents/nodes/n1.yaml:1:21", "'40000d' is longer than the longest duration"),
    # Made by the test itself (not storable as plain files in this repository, or too long to read):
    "two-mib-file": ("catalog/big.yaml:", "over the limit of 1048576 bytes"),
    # A 4,000-digit integer: float() raised OverflowError building the budget; in hex (4,816 decimal digits)
    # jsonschema raised ValueError writing its "greater than the maximum" message.
    "four-thousand-digit-budget": ("projects.yaml:8:15", "'9999999999999999'... (4000 characters) is out of range"),
    "four-thousand-digit-hex-replicas": ("catalog/gemma-3-270m.yaml:13:11", "(4002 characters) is out of range"),
    "symlink": ("catalog/link.yaml:", "is a symbolic link"),
    "symlinked-directory": ("agents/nodes:", "is a symbolic link"),
}

GENERATED = {"two-mib-file", "symlink", "symlinked-directory", "four-thousand-digit-budget",
             "four-thousand-digit-hex-replicas"}


def make_tree(case: str, tmp_path: Path) -> Path:
    tree = copy_example(tmp_path / "settings")
    if case == "two-mib-file":
        (tree / "catalog" / "big.yaml").write_text("engine: llama.cpp\n" + "# padding\n" * (2 * 1024 * 1024 // 10))
    elif case == "symlink":
        os.symlink("gemma-3-270m.yaml", tree / "catalog" / "link.yaml")
    elif case == "symlinked-directory":
        os.rename(tree / "agents" / "nodes", tree / "agents" / "real-nodes")
        os.symlink("real-nodes", tree / "agents" / "nodes")
        (tree / "agents" / "real-nodes" / "gpu-node-01.yaml").rename(tree / "agents" / "real-nodes" / "x.txt")
    elif case == "four-thousand-digit-budget":
        projects = tree / "projects.yaml"
        projects.write_text(projects.read_text().replace("budget: 5000.00", "budget: " + "9" * 4000, 1))
    elif case == "four-thousand-digit-hex-replicas":
        gemma = tree / "catalog" / "gemma-3-270m.yaml"
        gemma.write_text(gemma.read_text().replace("replicas: 1\n", "replicas: 0x" + "f" * 4000 + "\n", 1))
    else:
        overlay(tree, BAD / case)
    return tree


def test_the_corpus_has_at_least_forty_cases_and_the_table_covers_every_directory() -> None:
    on_disk = {p.name for p in BAD.iterdir() if p.is_dir()}
    assert on_disk == set(CASES) - GENERATED
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_tree_fails_validation_at_the_right_file_and_line(case: str, tmp_path: Path) -> None:
    where, reason = CASES[case]
    tree = make_tree(case, tmp_path)
    result = CliRunner().invoke(cli, ["validate", str(tree)])
    output = result.output  # click >= 8.2: stdout and stderr interleaved
    assert result.exit_code == 1, output
    assert result.exception is None or isinstance(result.exception, SystemExit), output
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if line and "warning:" not in line and not line.endswith(("error", "errors"))]
    assert len(errors) == 1, output
    line = errors[0]
    assert line.startswith(where if where.endswith(":") else where + ":"), output
    assert reason in line, output
    assert "1 error" in output


@pytest.mark.parametrize("case", ["yaml-bomb", "non-utf8", "python-tag", "two-mib-file", "symlink",
                                  "four-thousand-digit-budget", "four-thousand-digit-hex-replicas"])
def test_the_real_command_prints_one_line_per_error_and_no_traceback(case: str, tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    tree = make_tree(case, tmp_path)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "from llmgw.cli.main import main; main()", "validate", str(tree)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert CASES[case][0] in proc.stderr
    assert time.monotonic() - started < 10


def test_a_mistyped_store_url_is_refused_without_quoting_its_password(tmp_path: Path) -> None:
    tree = copy_example(tmp_path / "settings")
    llmgw_yaml = tree / "llmgw.yaml"
    llmgw_yaml.write_text(llmgw_yaml.read_text().replace("kind: sqlite", "kind: postgresql\n  url: mysql://admin:hunter2@db/llmgw"))
    result = CliRunner().invoke(cli, ["validate", str(tree)])
    assert result.exit_code == 1, result.output
    assert "llmgw.yaml:12:8: store.url: is not a PostgreSQL URL" in result.output
    assert "hunter2" not in result.output

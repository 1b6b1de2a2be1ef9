"""The one writer of settings edits made for a person (llmgw.settings.edit_commits) on a real bare repository: a
preview commits nothing and shows the diff the commit makes, `expect` refuses a branch that moved since, a model's
replicas (count or range) and adapters are edited in its catalog file with comments kept, and an edit that would not
validate is refused with `llmgw validate`'s words."""

from __future__ import annotations

from pathlib import Path

import pygit2
import pytest

from llmgw.errors import SettingsError, UsageError
from llmgw.settings import branch_head, init_repository, load_commit
from llmgw.settings.model_commits import ModelServing, commit_model_adapter, commit_model_replicas, commit_new_model
from llmgw.settings.node_commits import commit_node_verb, commit_serving_stopped
from settings_trees import EXAMPLE

ADA = ("Ada Lovelace", "ada@lab.example")
GGUF_SHA = "c" * 64


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    init_repository(tmp_path / "settings.git", EXAMPLE)
    return tmp_path / "settings.git"


def file_at_head(bare: Path, path: str) -> str:
    repo = pygit2.Repository(str(bare))
    head = repo.references["refs/heads/main"].peel(pygit2.Commit)
    return repo[head.tree[path].id].data.decode()


def changed_lines(diff: str) -> list[str]:
    """The removed and added lines of a unified diff (its file headers left out)."""
    return [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("--- ", "+++ "))]


def test_a_preview_commits_nothing_and_its_diff_is_what_the_commit_then_makes(bare: Path) -> None:
    before = branch_head(str(bare), "main")
    shown = commit_node_verb(bare, "drain", "gpu-node-01", *ADA, preview=True)
    assert (shown.preview, shown.changed, shown.commit) == (True, True, before)
    assert branch_head(str(bare), "main") == before  # nothing written
    assert shown.diff.startswith("--- a/llmgw.yaml\n+++ b/llmgw.yaml\n@@")
    assert "+  drained: [gpu-node-01]\n" in shown.diff
    done = commit_node_verb(bare, "drain", "gpu-node-01", *ADA, expect=shown.commit)
    assert done.changed and not done.preview and done.diff == shown.diff
    commit = pygit2.Repository(str(bare))[done.commit]
    assert (commit.author.name, commit.author.email, commit.committer.name) == (*ADA, "llmgw")
    assert load_commit(bare).cluster.drained == ("gpu-node-01",)
    unchanged = commit_node_verb(bare, "drain", "gpu-node-01", *ADA, preview=True)
    assert (unchanged.changed, unchanged.diff) == (False, "")


def test_a_branch_that_moved_since_the_preview_refuses_the_commit_and_says_who_moved_it(bare: Path) -> None:
    shown = commit_serving_stopped(bare, True, *ADA, preview=True)
    pushed = commit_node_verb(bare, "cordon", "gpu-node-01", "Bob", "bob@lab.example")  # someone else, meanwhile
    with pytest.raises(UsageError) as refused:
        commit_serving_stopped(bare, True, *ADA, expect=shown.commit)
    assert str(refused.value) == (
        f"the settings branch refs/heads/main moved since this change was shown (it was at {shown.commit[:12]}; it "
        f"is now at {pushed.commit[:12]}, \"llmgw node cordon gpu-node-01\" by Bob <bob@lab.example>): nothing was "
        "committed; look at the change again against the new head and confirm it")
    assert branch_head(str(bare), "main") == pushed.commit  # not half-applied: the branch is as Bob left it
    assert not load_commit(bare).cluster.serving_stopped


def test_a_models_replica_count_and_range_are_edited_in_its_catalog_file_with_comments_kept(bare: Path) -> None:
    shown = commit_model_replicas(bare, "smollm2-135m-instruct", *ADA, count=2, preview=True)
    assert "-replicas: 1\n+replicas: 2\n" in shown.diff and "catalog/smollm2-135m-instruct.yaml" in shown.diff
    assert changed_lines(shown.diff) == ["-replicas: 1", "+replicas: 2"]  # the file's `  - source:` lists kept
    done = commit_model_replicas(bare, "smollm2-135m-instruct", *ADA, count=2)
    assert pygit2.Repository(str(bare))[done.commit].message == "llmgw model smollm2-135m-instruct: replicas 2\n"
    assert load_commit(bare).models["smollm2-135m-instruct"].replicas == 2
    assert "cpu_cores: 0.5    # one engine thread" in file_at_head(bare, "catalog/smollm2-135m-instruct.yaml")
    commit_model_replicas(bare, "smollm2-135m-instruct", *ADA, low=1, high=3)
    scaling = load_commit(bare).models["smollm2-135m-instruct"].scaling
    assert (scaling.min, scaling.max) == (1, 3)
    assert "replicas: {min: 1, max: 3}\n" in file_at_head(bare, "catalog/smollm2-135m-instruct.yaml")
    commit_model_replicas(bare, "smollm2-135m-instruct", *ADA, low=0, high=4)  # a range is edited in place
    assert "replicas: {min: 0, max: 4}\n" in file_at_head(bare, "catalog/smollm2-135m-instruct.yaml")
    again = commit_model_replicas(bare, "smollm2-135m-instruct", *ADA, low=0, high=4)
    assert not again.changed


def test_an_adapter_joins_and_leaves_a_models_adapters(bare: Path) -> None:
    source = "hf://acme/gemma-pirate@" + "a" * 40 + "/gemma-pirate.gguf"
    commit_model_adapter(bare, "gemma-3-270m", "add", "gemma-pirate", ((source, GGUF_SHA),), *ADA)
    model = load_commit(bare).models["gemma-3-270m"]
    assert [(a.name, a.weights[0].source) for a in model.adapters] == [("gemma-pirate", source)]
    with pytest.raises(SettingsError, match="has an adapter named 'gemma-pirate' already"):
        commit_model_adapter(bare, "gemma-3-270m", "add", "gemma-pirate", ((source, GGUF_SHA),), *ADA)
    removed = commit_model_adapter(bare, "gemma-3-270m", "remove", "gemma-pirate", (), *ADA)
    assert removed.changed and load_commit(bare).models["gemma-3-270m"].adapters == ()
    assert not [line for line in file_at_head(bare, "catalog/gemma-3-270m.yaml").splitlines()
                if line.startswith("adapters:")]  # the key goes with its last adapter


def test_a_new_model_is_a_new_catalog_file_for_a_gpu_class_or_for_cpu_cores(bare: Path) -> None:
    source = "hf://acme/big@" + "a" * 40 + "/"
    gpu = ModelServing("vllm", ((source, ""),), replicas=2, gpus=4, gpu_class="h100-80g", tensor_parallel=4)
    shown = commit_new_model(bare, "big", gpu, *ADA, preview=True)
    assert shown.preview and shown.diff.startswith("--- a/catalog/big.yaml\n+++ b/catalog/big.yaml\n")
    assert "big" not in load_commit(bare).models
    done = commit_new_model(bare, "big", gpu, *ADA, expect=shown.commit)
    assert done.changed and file_at_head(bare, "catalog/big.yaml") == (
        f"name: big\nengine: vllm\nweights:\n  - source: {source}\nreplicas: 2\nresources:\n  gpus: 4\n"
        "  gpu_class: h100-80g\n  tensor_parallel: 4\n")
    big = load_commit(bare).models["big"]
    assert (big.engine, big.replicas, big.resources.gpus, big.resources.tensor_parallel) == ("vllm", 2, 4, 4)
    small = ModelServing("llama.cpp", (("hf://acme/s@" + "b" * 40 + "/s.gguf", GGUF_SHA),), cpu_cores=0.5,
                         memory_bytes=400 * 2**20 + 1)
    commit_new_model(bare, "small", small, *ADA)
    model = load_commit(bare).models["small"]
    assert (model.resources.cpu_cores, model.resources.memory_bytes) == (0.5, 401 * 2**20)


@pytest.mark.parametrize(("edit", "words"), [
    (lambda bare: commit_new_model(bare, "gemma-3-270m", ModelServing("llama.cpp", (("hf://a/b@" + "a" * 40
                                   + "/m.gguf", GGUF_SHA),), cpu_cores=1), *ADA),
     "a model named 'gemma-3-270m' is in the catalog already"),
    (lambda bare: commit_new_model(bare, "unpinned", ModelServing("llama.cpp", (("hf://a/b@" + "a" * 40
                                   + "/m.gguf", ""),), cpu_cores=1), *ADA),
     "a weights file needs its sha256"),
    (lambda bare: commit_model_replicas(bare, "smollm2-135m-instruct", *ADA, low=3, high=1),
     "catalog/smollm2-135m-instruct.yaml:"),
    (lambda bare: commit_model_adapter(bare, "gemma-3-270m", "add", "pirate", (("hf://acme/p@" + "a" * 40
                                       + "/adapter_config.json", GGUF_SHA),), *ADA),
     "llama.cpp loads a LoRA adapter from one GGUF file"),
    (lambda bare: commit_model_replicas(bare, "no-such-model", *ADA, count=1),
     "no catalog file serves a model named 'no-such-model'; the models are gemma-3-270m"),
])
def test_an_edit_that_would_not_validate_is_refused_with_validates_words(bare: Path, edit, words: str) -> None:
    before = branch_head(str(bare), "main")
    with pytest.raises(SettingsError) as refused:
        edit(bare)
    assert words in str(refused.value)
    assert branch_head(str(bare), "main") == before

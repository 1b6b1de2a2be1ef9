"""A model's replicas and LoRA adapters as commits on a person's behalf (the console's and the admin API's model
actions), written by the one writer `llmgw.settings.edit_commits.commit_edit` into the model's catalog file:

- replicas: `replicas: N` (a fixed count; an autoscaled model's range and targets are replaced by it), or a range
  `replicas: {min, max}` (the autoscaler's targets already there are kept);
- adapters: an adapter `{name, weights: [{source, sha256}, ...]}` joins `adapters:`, or the adapter of that name
  leaves it (the key goes with the last one);
- a new model (the model explorer's serve form): `catalog/<model>.yaml` written with its name, engine, weights,
  replicas and resources (`ModelServing`), refused when that file or another catalog file serves the name already.
Whether the result is valid (counts, adapter names and files for the model's engine) is `llmgw validate`'s word:
the new tree is validated before anything is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from llmgw.errors import Issue, SettingsError
from llmgw.settings.model import Model
from llmgw.settings.edit_commits import Edit, EditCommit, FileOf, commit_edit, round_trip_yaml
from llmgw.settings.reading import TreeFiles
from llmgw.settings.refs import DEFAULT_BRANCH

DEFAULT_REPLICAS: int = Model.replicas
"""What a catalog file without `replicas:` runs (the default of `Model.replicas`)."""


def catalog_file_of(model: str) -> FileOf:
    """The catalog file whose `name:` is `model` (catalog/<model>.yaml first). Raises SettingsError naming the catalog
    when no file serves that model."""

    def find(tree: TreeFiles) -> str:
        usual = f"catalog/{model}.yaml"
        paths = sorted(p for p in tree.texts if p.startswith("catalog/") and p.endswith(".yaml"))
        for path in ([usual] if usual in paths else []) + paths:
            data = round_trip_yaml().load(tree.texts[path])
            if isinstance(data, dict) and data.get("name") == model:
                return path
        raise SettingsError([Issue("catalog/", 0, 0, "", f"no catalog file serves a model named {model!r}; the "
                                   f"models are {', '.join(_names(tree, paths)) or 'none'}")])

    return find


def _names(tree: TreeFiles, paths: list[str]) -> list[str]:
    names = []
    for path in paths:
        data = round_trip_yaml().load(tree.texts[path])
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            names.append(data["name"])
    return names


def _edit_replicas(count: int | None, low: int | None, high: int | None) -> Edit:
    def edit(document: CommentedMap) -> bool:
        now = document.get("replicas")
        if count is not None:
            if (now == count or (now is None and count == DEFAULT_REPLICAS)) and not isinstance(now, dict):
                return False
            document["replicas"] = count
            return True
        if isinstance(now, dict):
            if (now.get("min"), now.get("max")) == (low, high):
                return False
            now["min"], now["max"] = low, high
            return True
        wanted = CommentedMap([("min", low), ("max", high)])
        wanted.fa.set_flow_style()
        document["replicas"] = wanted
        return True

    return edit


def commit_model_replicas(repo_path: str | os.PathLike[str], model: str, author_name: str, author_email: str,
                          branch: str = DEFAULT_BRANCH, *, count: int | None = None, low: int | None = None,
                          high: int | None = None, expect: str = "", preview: bool = False) -> EditCommit:
    """Commit `model`'s replica `count` (a fixed count), or its range `low`..`high` (autoscaled), to its catalog file as
    the person. Exactly one of `count` and (`low`, `high`) is given. `expect`, `preview`: `commit_edit`.

    Raises: SettingsError when no catalog file serves `model` or the result does not validate (a negative count,
    min above max, ...); UsageError when the head is not `expect`; ValueError when the arguments are neither form.
    """
    if (count is None) == (low is None or high is None):
        raise ValueError("give a replica count, or a range's low and high")
    wanted = f"{count}" if count is not None else f"{low}..{high}"
    return commit_edit(repo_path, catalog_file_of(model), _edit_replicas(count, low, high),
                       f"llmgw model {model}: replicas {wanted}\n", author_name, author_email, branch, expect=expect,
                       preview=preview)


def _edit_adapter(name: str, weights: tuple[tuple[str, str], ...] | None) -> Edit:
    def edit(document: CommentedMap) -> bool:
        adapters = document.get("adapters")
        have = next((a for a in adapters or () if isinstance(a, dict) and a.get("name") == name), None)
        if weights is None:  # remove
            if have is None:
                return False
            adapters.remove(have)
            if not adapters:
                del document["adapters"]
            return True
        if have is not None:
            raise SettingsError([Issue("", 0, 0, "adapters", f"the model has an adapter named {name!r} already; "
                                       "remove it first to replace its weights")])
        if adapters is None:
            adapters = document["adapters"] = CommentedSeq()
        files = CommentedSeq(CommentedMap([("source", source), ("sha256", sha256)]) for source, sha256 in weights)
        adapters.append(CommentedMap([("name", name), ("weights", files)]))
        return True

    return edit


def commit_model_adapter(repo_path: str | os.PathLike[str], model: str, action: str, name: str,
                         weights: tuple[tuple[str, str], ...], author_name: str, author_email: str,
                         branch: str = DEFAULT_BRANCH, *, expect: str = "", preview: bool = False) -> EditCommit:
    """Commit `action` "add" (adapter `name` with `weights`, (source, sha256) pairs, joins `model`'s adapters) or
    "remove" (the adapter `name` leaves them; `weights` unused) to the model's catalog file as the person.
    `expect`, `preview`: `commit_edit`.

    Raises: SettingsError when no catalog file serves `model`, the adapter is there already (add), or the result does
    not validate (a bad name, weights the engine cannot load, ...); UsageError when the head is not `expect`;
    ValueError for another action.
    """
    if action not in ("add", "remove"):
        raise ValueError(f"unknown adapter action {action!r}")
    verb = "added to" if action == "add" else "removed from"
    return commit_edit(repo_path, catalog_file_of(model),
                       _edit_adapter(name, tuple(weights) if action == "add" else None),
                       f"llmgw model {model}: adapter {name} {verb.split()[0]}\n\nLoRA adapter {name} {verb} "
                       f"{model}'s adapters.\n", author_name, author_email, branch, expect=expect, preview=preview)


@dataclass(frozen=True)
class ModelServing:
    """A new model's catalog file: `engine` (of ENGINES), `weights` ((source, sha256) pairs; "" for a directory
    source's set digest), `replicas`, and each replica's resources: `gpus` of `gpu_class` with `tensor_parallel`
    (a GPU model), or `cpu_cores` and `memory_bytes` (a CPU model)."""

    engine: str
    weights: tuple[tuple[str, str], ...]
    replicas: int = 1
    gpus: int = 0
    gpu_class: str = ""
    tensor_parallel: int = 1
    cpu_cores: float = 0.0
    memory_bytes: int = 0


def _edit_new_model(model: str, serving: ModelServing, others: list[str]) -> Edit:
    def edit(document: CommentedMap) -> bool:
        if document or model in others:
            raise SettingsError([Issue(f"catalog/{model}.yaml", 0, 0, "name", f"a model named {model!r} is in the "
                                       "catalog already (or its file exists): choose another name, or change that "
                                       "model's replicas instead")])
        files = CommentedSeq(CommentedMap([("source", source), *([("sha256", sha256)] if sha256 else [])])
                             for source, sha256 in serving.weights)
        resources = CommentedMap()
        if serving.gpus:
            resources["gpus"] = serving.gpus
            if serving.gpu_class:
                resources["gpu_class"] = serving.gpu_class
            if serving.tensor_parallel > 1:
                resources["tensor_parallel"] = serving.tensor_parallel
        else:
            resources["cpu_cores"] = serving.cpu_cores if serving.cpu_cores % 1 else int(serving.cpu_cores)
            if serving.memory_bytes:
                resources["memory"] = f"{-(-serving.memory_bytes // 2**20)}Mi"
        document.update([("name", model), ("engine", serving.engine), ("weights", files),
                         ("replicas", serving.replicas), ("resources", resources)])
        return True

    return edit


def commit_new_model(repo_path: str | os.PathLike[str], model: str, serving: ModelServing, author_name: str,
                     author_email: str, branch: str = DEFAULT_BRANCH, *, expect: str = "",
                     preview: bool = False) -> EditCommit:
    """Commit a new catalog file `catalog/<model>.yaml` serving `model` as `serving` says, as the person.
    `expect`, `preview`: `commit_edit`.

    Raises: SettingsError when a catalog file serves `model` already, or the result does not validate (an engine
    that cannot load those weights, a source without its sha256, a GPU class and count that disagree, ...: `llmgw
    validate`'s words, file and line); UsageError when the head is not `expect`.
    """
    def file_of(tree: TreeFiles) -> str:
        paths = sorted(p for p in tree.texts if p.startswith("catalog/") and p.endswith(".yaml"))
        others.extend(_names(tree, paths))
        return f"catalog/{model}.yaml"

    others: list[str] = []
    where = f"{serving.gpus} x {serving.gpu_class or 'GPU'}" if serving.gpus else f"{serving.cpu_cores:g} cores"
    return commit_edit(repo_path, file_of, _edit_new_model(model, serving, others),
                       f"llmgw model {model}: served ({serving.engine}, {serving.replicas} replica(s) of {where})\n",
                       author_name, author_email, branch, expect=expect, preview=preview, create=True)

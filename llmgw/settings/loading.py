"""Loading a whole settings tree: `load_directory(path)` and `load_commit(repo_path, rev)`.

Stages, each reporting every issue it finds before the next one looks: read the files (reading.py), parse
each (parsing.py), check each against its schema (schemas.py), build the typed model and make the cross-file
checks (building.py); keys of capabilities not built yet become warnings (unbuilt.py). Any error ends in one
SettingsError carrying every error found; warnings travel on `Settings.warnings`. Nothing else escapes: settings come from anyone who can push, and the watcher and the
pre-receive hook must get a sentence, not a traceback, even for input that trips a bug (see `load_tree`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import pygit2

from llmgw.errors import Issue, SettingsError
from llmgw.settings.people import People, build_people
from llmgw.settings.building import (
    Found, build_agent, build_cluster, build_engines, build_model, build_projects, build_settings, check_model,
    check_names,
)
from llmgw.settings.model import AgentSettings, Model, Settings
from llmgw.settings.parsing import Parsed, parse_yaml
from llmgw.settings.reading import TreeFiles, open_repository, read_commit, read_directory, resolve_commit
from llmgw.settings.schemas import validate_data
from llmgw.settings.firewall import FirewallSettings, build_firewall
from llmgw.settings.slurm import SlurmSettings, build_slurm
from llmgw.settings.unbuilt import unbuilt_warnings
from llmgw.settings.url_secrets import secret_in_url_message, urls_with_secrets
from llmgw.settings.valid_trees import read_valid_trees

SchemaCheck = Callable[[str, str, Parsed], list[Issue]]
"""`check(kind, file, parsed)`: every schema violation of one parsed file as an Issue (`validate_data` is the one)."""

_SINGLE = {"llmgw.yaml": "llmgw", "engines.yaml": "engines", "projects.yaml": "projects",
           "firewall.yaml": "firewall", "slurm.yaml": "slurm", "agents/default.yaml": "agent"}
_STEM = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


def classify(path: str) -> str | None:
    """The schema kind of settings file `path` ("model", "agent", ...), or None when it is not a settings file."""
    if path in _SINGLE:
        return _SINGLE[path]
    if path.startswith("catalog/") and path.count("/") == 1 and path.endswith(".yaml"):
        return "model"
    if path.startswith("agents/nodes/") and path.count("/") == 2 and path.endswith(".yaml"):
        return "agent"
    return None


def _stem(path: str) -> str:
    return path.rsplit("/", 1)[-1][: -len(".yaml")]


def _names_of_invalid_model(path: str, data: Any) -> set[str]:
    """Names a model file that failed its checks would define, so other files naming it raise no second error."""
    names = {_stem(path)}
    if isinstance(data, dict):
        if isinstance(data.get("name"), str):
            names.add(data["name"])
        if isinstance(data.get("aliases"), list):
            names.update(a for a in data["aliases"] if isinstance(a, str))
        if isinstance(data.get("adapters"), list):
            names.update(a["name"] for a in data["adapters"] if isinstance(a, dict) and isinstance(a.get("name"), str))
    return names


def _parse_all(tree: TreeFiles, found: Found, invalid_names: set[str],
               check_schema: SchemaCheck | None) -> dict[str, tuple[str, Any]]:
    """Parse and schema-check (with `check_schema`; None: no schema check) every file; return (kind, data) of the
    files that passed.

    Adds to `invalid_names` the names model files that failed would define.
    """
    good: dict[str, tuple[str, Any]] = {}
    for path in sorted(tree.texts):
        found.current = path
        kind = classify(path)
        if kind is None:
            hint = f"; did you mean {path[:-4]}.yaml?" if path.endswith(".yml") else ""
            found.issues.append(Issue(path, 0, 0, "", "is not a settings file: expected llmgw.yaml, engines.yaml, "
                                      "projects.yaml, firewall.yaml, slurm.yaml, catalog/<model>.yaml, "
                                      f"agents/default.yaml or agents/nodes/<node-id>.yaml{hint}"))
            continue
        if path.startswith(("catalog/", "agents/nodes/")):
            if not _STEM.match(_stem(path)):
                found.issues.append(Issue(path, 0, 0, "", f"file name {_stem(path)!r} is not a valid name: use "
                                          "lower-case letters, digits, '.', '_' or '-'"))
                continue
        parsed, issues = parse_yaml(path, tree.texts[path])
        found.files[path] = parsed
        if kind == "model":
            invalid_names.update(_names_of_invalid_model(path, parsed.data))
        if issues:
            found.issues.extend(issues)
            continue
        if parsed.data is None:
            what = "a model" if kind == "model" else "its settings"
            found.issues.append(Issue(path, 1, 1, "", f"file is empty; it must hold a mapping with {what}"
                                      + (" (or delete the file)" if kind != "llmgw" else "")))
            continue
        if not isinstance(parsed.data, dict):
            kind_word = "list" if isinstance(parsed.data, list) else type(parsed.data).__name__
            found.issues.append(Issue(path, *parsed.position(()), "",
                                      f"the file holds a {kind_word}; it must hold a mapping (key: value lines)"))
            continue
        schema_issues = check_schema(kind, path, parsed) if check_schema is not None else []
        if schema_issues:
            found.issues.extend(schema_issues)
            continue
        good[path] = (kind, parsed.data)
        found.issues.extend(unbuilt_warnings(kind, path, parsed))
        if kind == "model":
            invalid_names.difference_update(_names_of_invalid_model(path, parsed.data))
    return good


def _check_node_lists(found: Found, cluster: Any, fleet: frozenset[str]) -> None:
    """A warning for each node serving.cordoned / serving.drained names that has no agents/nodes/<node>.yaml: the
    settings cannot see the live fleet, so the name is taken as given (a typo cordons nothing; the warning says so)."""
    for key, ids in (("cordoned", cluster.cordoned), ("drained", cluster.drained)):
        for index, node in enumerate(ids):
            if node not in fleet:
                found.add("llmgw.yaml", ("serving", key, index), f"warning: no agents/nodes/{node}.yaml names node "
                          f"{node!r}; it is {key} when a node of that id registers (check the spelling)",
                          severity="warning")


def load_tree(tree: TreeFiles, commit: str | None = None, *, schema_checked: bool = False,
              check_schema: SchemaCheck = validate_data) -> Settings:
    """Validate and build the Settings of `tree` (files as read by reading.py).

    `check_schema` checks each parsed file against its schema (default `validate_data`). `schema_checked`: the
    tree's files are known to pass that check under this llmgw (the pre-receive hook checked this very tree, see
    `load_commit`), so it is not run again; every other stage still is (reading, YAML parsing, which builds the
    data, and building with its cross-file checks, which also find the warnings). The schema check is the costly
    stage (about 55 % of loading the example tree) and the only one skipped.
    Returns Settings (frozen, units normalised; `warnings` holds warnings). Raises: SettingsError with every
    error found, sorted by file, line and column; and SettingsError, never anything else, naming the file being
    loaded when a stage fails in a way no check foresaw (a bug of llmgw or of a library it uses), so that the
    commit is refused with a sentence and whoever reads settings keeps running.
    """
    found = Found(files={})
    try:
        return _load_tree(tree, commit, found, None if schema_checked else check_schema)
    except SettingsError:
        raise
    except Exception as exc:  # noqa: BLE001 - the boundary of untrusted input: any failure is this tree's, as a sentence
        where = found.current or "(settings tree)"
        raise SettingsError([Issue(where, 0, 0, "", f"cannot be loaded: {type(exc).__name__}: {str(exc)[:200]}; "
                                   "this is a bug of llmgw: please report it with this file")]) from exc


def _load_tree(tree: TreeFiles, commit: str | None, found: Found, check_schema: SchemaCheck | None) -> Settings:
    found.issues.extend(tree.issues)
    invalid_names: set[str] = set()
    for path in tree.issues:
        if path.file.startswith("catalog/") and path.file.endswith(".yaml"):
            invalid_names.add(_stem(path.file))
    good = _parse_all(tree, found, invalid_names, check_schema)
    for path, (_kind, data) in good.items():  # secrets inside URLs: refused, the settings live in git
        for key_path, what in urls_with_secrets(data):
            found.add(path, key_path, secret_in_url_message(key_path, what))

    if "llmgw.yaml" not in tree.texts and not any(i.file == "llmgw.yaml" for i in found.issues):
        found.issues.append(Issue("llmgw.yaml", 0, 0, "", "is missing; every settings tree has one (name: <cluster>)"))
    found.current = "llmgw.yaml"
    cluster = build_cluster(good["llmgw.yaml"][1]) if "llmgw.yaml" in good else None

    found.current = "engines.yaml"
    engines = build_engines(good["engines.yaml"][1], found, "engines.yaml") if "engines.yaml" in good else {}

    models: dict[str, Model] = {}
    for path, (kind, data) in good.items():
        if kind == "model":
            found.current = path
            model = build_model(_stem(path), path, data)
            check_model(found, path, _stem(path), data, model)
            if model.name in models:
                found.add(path, ("name",), f"model {model.name!r} is also defined in {models[model.name].source_file}")
                continue
            models[model.name] = model
            if not model.endpoints and ("engines.yaml" in good or "engines.yaml" not in tree.texts):
                default = [e for e in engines.values() if e.engine == model.engine and e.default]
                if model.engine_version is not None and (model.engine, model.engine_version) not in engines:
                    found.add(path, ("engine_version",), f"engines.yaml lists no version {model.engine_version!r} "
                                                         f"of {model.engine}")
                elif model.engine_version is None and not default:
                    found.add(path, ("engine",), f"engines.yaml has no default version of {model.engine}; "
                                                 "name an engine_version or mark one default")
    found.current = "catalog/"
    known = check_names(found, models) | invalid_names

    if cluster is not None and not models and not invalid_names and not cluster.allow_empty and "llmgw.yaml" in good:
        found.add("llmgw.yaml", ("serving",) if "serving" in good["llmgw.yaml"][1] else (),
                  "the catalog holds no model; add catalog/<model>.yaml or set serving.allow_empty: true")

    found.current = "agents/default.yaml"
    agent_defaults = build_agent(good["agents/default.yaml"][1]) if "agents/default.yaml" in good else AgentSettings()
    node_agents: dict[str, AgentSettings] = {}
    for path, (kind, data) in good.items():
        if path.startswith("agents/nodes/"):
            found.current = path
            node_agents[_stem(path)] = build_agent(data, agent_defaults)

    orgs, teams, projects = ({}, {}, {})
    people = People()
    if "projects.yaml" in good:
        found.current = "projects.yaml"
        people = build_people(good["projects.yaml"][1].get("people", {}), found, "projects.yaml")
        # A catalog file that did not load may hold the aliases a project names: no follow-on errors for those.
        orgs, teams, projects = build_projects(good["projects.yaml"][1], found, "projects.yaml",
                                               None if invalid_names else known)

    found.current = "firewall.yaml"
    firewall = (build_firewall(good["firewall.yaml"][1], found, "firewall.yaml",
                               cluster.control_planes if cluster is not None else (),
                               {name: getattr(cluster, name).port for name in ("gateway", "admin", "agents")}
                               if cluster is not None else None)
                if "firewall.yaml" in good else FirewallSettings())
    found.current = "slurm.yaml"
    # The nodes the settings know; None (no fleet checks) when agents/nodes/ itself could not be read.
    fleet = None if any(i.file.startswith("agents/nodes") for i in tree.issues) else frozenset(
        _stem(path) for path in tree.texts if path.startswith("agents/nodes/"))
    slurm = build_slurm(good["slurm.yaml"][1], found, "slurm.yaml", fleet) if "slurm.yaml" in good else SlurmSettings()
    members = {member for project in projects.values() for member in project.members}
    for email in slurm.ssh_keys:
        if "projects.yaml" in good and email not in members:
            found.add("slurm.yaml", ("ssh_keys", email), f"{email} is a member of no project in projects.yaml: no "
                      "Linux user is made for it, so its keys are not written", of_key=True, severity="warning")
    found.current = "llmgw.yaml"
    if cluster is not None and fleet is not None:
        _check_node_lists(found, cluster, fleet)

    found.current = ""
    errors = sorted((i for i in found.issues if i.severity == "error"), key=lambda i: (i.file, i.line, i.column))
    warnings = tuple(sorted((i for i in found.issues if i.severity != "error"), key=lambda i: (i.file, i.line)))
    if errors or cluster is None:
        raise SettingsError(errors + list(warnings))
    return build_settings(
        cluster, models=models, engines=engines, agent_defaults=agent_defaults, node_agents=node_agents,
        organisations=orgs, teams=teams, projects=projects, firewall=firewall, slurm=slurm, people=people,
        commit=commit,
        warnings=warnings,
    )


def load_directory(path: str | os.PathLike[str]) -> Settings:
    """Load and validate the settings tree in directory `path` (a working tree; its .git is skipped).

    Returns Settings with `commit` None. Raises: SettingsError with every error (see load_tree).
    """
    return load_tree(read_directory(path))


_SETTINGS_TOP = frozenset({"llmgw.yaml", "engines.yaml", "projects.yaml", "firewall.yaml", "slurm.yaml", "catalog",
                           "agents"})
"""The names a settings tree's top level may hold (docs/settings.md): a commit holding none of them is another
repository's (a source checkout), refused in one sentence instead of one error per file."""


def _refuse_other_tree(repo: pygit2.Repository, rev: str, commit: pygit2.Commit) -> None:
    """Raise SettingsError (one issue naming `rev`) when `commit`'s tree is not empty and holds no settings file or
    directory at its top (the repository is not a settings repository); otherwise return."""
    names = [entry.name for entry in commit.tree]
    if names and not _SETTINGS_TOP.intersection(names):
        shown = ", ".join(sorted(names)[:4]) + (", ..." if len(names) > 4 else "")
        raise SettingsError([Issue(rev, 0, 0, "", f"commit {str(commit.id)[:12]} of {repo.path} holds no settings "
                                   f"tree (no llmgw.yaml, catalog/ or other settings file at its top, but {shown}): "
                                   "give the settings repository with --repo")])


def load_commit(repo_path: str | os.PathLike[str], rev: str = "refs/heads/main", *, from_env: bool = False,
                trust_hook_record: bool = False, check_schema: SchemaCheck = validate_data) -> Settings:
    """Load and validate the settings tree of commit `rev` of the git repository at `repo_path` (bare or not).

    `rev` is anything git's rev-parse takes (branch, tag, ref, commit id). `from_env` opens the repository
    from GIT_* variables (hooks). `trust_hook_record`: when this repository's record of valid trees
    (`llmgw.settings.valid_trees`, written by its pre-receive hook) holds the commit's tree id under this llmgw's
    validation key, the schema check is skipped (see `load_tree`): the hook ran it on the same bytes with the same
    schemas and code, and a pusher cannot write the record. A tree not recorded, or recorded under another key, is
    validated in full. `check_schema` is the schema check run otherwise (default `validate_data`).
    Returns Settings with `commit` set to the commit id (40 hex).
    Raises: SettingsError when the repository or revision do not exist, or with every error of the tree.
    """
    repo = open_repository(repo_path, from_env=from_env)
    commit = resolve_commit(repo, rev)
    _refuse_other_tree(repo, rev, commit)
    checked = trust_hook_record and str(commit.tree_id) in read_valid_trees(repo.path)
    try:
        files = read_commit(repo, commit)
    except (KeyError, ValueError, pygit2.GitError) as exc:
        raise SettingsError([Issue(str(commit.id), 0, 0, "", f"cannot be read from {repo.path}: an object of its "
                                   f"tree is missing or damaged ({exc})")]) from exc
    return load_tree(files, commit=str(commit.id), schema_checked=checked, check_schema=check_schema)

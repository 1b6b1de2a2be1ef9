"""`diff_settings` and `llmgw diff`: what changed per model, node and project, without noise or secrets."""

from __future__ import annotations

import json
from pathlib import Path

import pygit2
import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.settings import diff_settings, load_directory
from llmgw.settings.diffing import REDACTED_CHANGED
from settings_trees import commit_tree, copy_example

GEMMA = "catalog/gemma-3-270m.yaml"


def edit(tree: Path, rel: str, old: str, new: str) -> None:
    path = tree / rel
    text = path.read_text()
    assert old in text, f"{old!r} not in {rel}"
    path.write_text(text.replace(old, new, 1))


# Edits that mean the same settings: no change may show.
SAME = [
    (GEMMA, "memory: 1Gi", "memory: 1024Mi"),
    (GEMMA, "memory: 1Gi", "memory: 1073741824B"),
    ("projects.yaml", "budget: 5000.00", "budget: 5000"),
    ("llmgw.yaml", "interval: 10s ", "interval: 10000ms "),
    ("llmgw.yaml", "action_timeout: 10m", "action_timeout: 600s"),
    ("llmgw.yaml", "action_timeout: 10m", "action_timeout: 10m\n  forecast_check_after: 60m"),  # the default
    ("llmgw.yaml", "port: 8080}", "port: 8080, drain_timeout: 30s}"),  # the default, written out
    (GEMMA, "replicas: 1\n", "replicas: 1\nallow_pickle: false\n"),
    (GEMMA, "cpu_cores: 0.5\n", "cpu_cores: 0.50\n  tensor_parallel: 1\n"),
    ("agents/default.yaml", "engines_dir: engines\n", ""),
    ("catalog/llama-3.1-70b-instruct.yaml", '"0.90"', '"0.90"'),
    (GEMMA, "aliases: [gemma, gemma-3]", "aliases:\n  - gemma\n  - gemma-3  # a comment"),
    ("slurm.yaml", "accounting: false\n", ""),
    ("firewall.yaml", "backend: nftables\n", ""),
]


@pytest.mark.parametrize(("rel", "old", "new"), SAME)
def test_equivalent_writing_shows_no_change(rel: str, old: str, new: str, example_tree: Path) -> None:
    before = load_directory(example_tree)
    edit(example_tree, rel, old, new)
    assert not diff_settings(before, load_directory(example_tree))


# (file, old, new) -> (section, name, action, path, old shown, new shown)
CHANGES = [
    ((GEMMA, "replicas: 1\n", "replicas: 3\n"), ("model", "gemma-3-270m", "changed", "replicas", "1", "3")),
    ((GEMMA, "memory: 1Gi", "memory: 1536Mi"), ("model", "gemma-3-270m", "changed", "resources.memory_bytes", "1Gi", "1.5Gi")),
    ((GEMMA, '"gemma"]', '"chatml"]'), ("model", "gemma-3-270m", "changed", "engine_args",
                                        '["--no-jinja", "--chat-template", "gemma"]', '["--no-jinja", "--chat-template", "chatml"]')),
    (("agents/nodes/gpu-node-01.yaml", "rack: r12", "rack: r13"), ("node", "gpu-node-01", "changed", "labels.rack", '"r12"', '"r13"')),
    (("agents/default.yaml", "heartbeat_interval: 5s", "heartbeat_interval: 2s"), ("agents", "default", "changed", "heartbeat_interval", "5s", "2s")),
    (("projects.yaml", "requests_per_minute: 120", "requests_per_minute: 240"),
     ("project", "ci", "changed", "quota.requests_per_minute", "120", "240")),
    (("llmgw.yaml", "stopped: false", "stopped: true"), ("cluster", "demo", "changed", "serving_stopped", "false", "true")),
    (("engines.yaml", "version: 0.5.3\n    default: true", "version: 0.5.3\n    default: false"),
     ("engine", "sglang@0.5.3", "changed", "default", "true", "false")),
    (("slurm.yaml", "{partition: gpu}", "{partition: gpu, lent: true}"),
     ("slurm", "slurm", "changed", "nodes.gpu-node-01.lent", "false", "true")),
]


@pytest.mark.parametrize(("edit_args", "expected"), CHANGES)
def test_a_real_change_shows_once_where_it_belongs(edit_args, expected, example_tree: Path) -> None:
    before = load_directory(example_tree)
    edit(example_tree, *edit_args)
    diff = diff_settings(before, load_directory(example_tree))
    assert len(diff.changes) == 1, diff.to_text()
    change = diff.changes[0]
    section, name, action, path, old, new = expected
    assert (change.section, change.name, change.action) == (section, name, action)
    assert [(f.path, f.old, f.new) for f in change.fields] == [(path, old, new)]


def test_a_default_change_does_not_repeat_on_nodes_that_inherit_it(example_tree: Path) -> None:
    before = load_directory(example_tree)
    edit(example_tree, "agents/default.yaml", "weights_dir: weights", "weights_dir: /srv/weights")
    diff = diff_settings(before, load_directory(example_tree))
    assert [(c.section, c.name) for c in diff.changes] == [("agents", "default")]


def test_added_and_removed_subjects_are_listed(example_tree: Path) -> None:
    before = load_directory(example_tree)
    (example_tree / "catalog" / "gemma-copy.yaml").write_text(
        (example_tree / GEMMA).read_text().replace("name: gemma-3-270m", "name: gemma-copy").replace("aliases: [gemma, gemma-3]", ""))
    (example_tree / "agents" / "nodes" / "gpu-node-01.yaml").unlink()
    (example_tree / "slurm.yaml").write_text("enabled: false\n")  # it named the node as lendable
    text = diff_settings(before, load_directory(example_tree)).to_text()
    assert "+ model gemma-copy\n" in text and "    replicas: 1\n" in text
    assert "- node gpu-node-01\n" in text and '    labels.rack: "r12"' in text


def test_secret_values_never_show_but_their_change_does(example_tree: Path) -> None:
    edit(example_tree, "llmgw.yaml", "path: llmgw.sqlite3", "path: llmgw.sqlite3\n  url: postgresql://llmgw@hunter2.db/llmgw")
    before = load_directory(example_tree)
    edit(example_tree, "llmgw.yaml", "hunter2", "correct-horse")
    edit(example_tree, "catalog/llama-3.1-70b-instruct.yaml", "secret: hf-token", "secret: hf-token-2")
    diff = diff_settings(before, load_directory(example_tree))
    dumped = diff.to_text() + json.dumps(diff.to_json())
    assert "hunter2" not in dumped and "correct-horse" not in dumped and "hf-token" not in dumped
    fields = {(c.name, f.path): (f.old, f.new) for c in diff.changes for f in c.fields}
    assert fields[("demo", "store.url")] == (REDACTED_CHANGED, REDACTED_CHANGED)
    assert fields[("llama-3.1-70b-instruct", "weights[0].secret")] == (REDACTED_CHANGED, REDACTED_CHANGED)
    assert f"store.url: {REDACTED_CHANGED}\n" in diff.to_text()


def test_the_command_exits_0_without_change_2_with_changes_1_on_error(tmp_path: Path) -> None:
    a, b = copy_example(tmp_path / "a"), copy_example(tmp_path / "b")
    runner = CliRunner()
    same = runner.invoke(cli, ["diff", str(a), str(b)])
    assert (same.exit_code, same.output.strip()) == (0, "no changes")
    edit(b, GEMMA, "replicas: 1\n", "replicas: 2\n")
    changed = runner.invoke(cli, ["diff", str(a), str(b)])
    assert changed.exit_code == 2
    assert changed.output == "~ model gemma-3-270m\n    replicas: 1 -> 2\n"
    as_json = runner.invoke(cli, ["diff", "--json", str(a), str(b)])
    assert as_json.exit_code == 2
    assert json.loads(as_json.output)["changes"][0]["fields"] == [{"path": "replicas", "old": "1", "new": "2"}]
    edit(b, GEMMA, "replicas: 2\n", "replicas: two\n")
    broken = runner.invoke(cli, ["diff", str(a), str(b)])
    assert broken.exit_code == 1
    assert f"{GEMMA}:13:11: replicas: 'two' is not of type 'integer'" in broken.output


def test_the_command_compares_branches_and_commits_of_a_repository(tmp_path: Path) -> None:
    tree = copy_example(tmp_path / "tree")
    repo = pygit2.init_repository(str(tmp_path / "repo.git"), bare=True, initial_head="main")
    first = commit_tree(repo, tree, "first")
    edit(tree, "projects.yaml", "tokens_per_day: 2000000", "tokens_per_day: 4000000")
    second = commit_tree(repo, tree, "second", ref="refs/heads/proposal")
    runner = CliRunner()
    result = runner.invoke(cli, ["diff", "--repo", str(tmp_path / "repo.git"), "main", "proposal"])
    assert result.exit_code == 2, result.output
    assert result.output == "~ project ci\n    quota.tokens_per_day: 2000000 -> 4000000\n"
    by_id = runner.invoke(cli, ["diff", "--repo", str(tmp_path / "repo.git"), first, second[:12]])
    assert by_id.output == result.output
    unknown = runner.invoke(cli, ["diff", "--repo", str(tmp_path / "repo.git"), "main", "no-such-branch"])
    assert unknown.exit_code == 1 and "no-such-branch: names no commit" in unknown.output


def test_a_repository_that_holds_no_settings_is_named_in_one_error(tmp_path: Path) -> None:
    """Run in a source checkout (no llmgw.yaml, catalog/ or other settings file at its top), `llmgw diff` said "is not
    a settings file" once per file of the checkout (109 lines); it now says once what the repository is not."""
    source = tmp_path / "source"
    (source / "llmgw").mkdir(parents=True)
    (source / "README.md").write_text("# a project\n")
    (source / "llmgw" / "settings.yaml").write_text("a: 1\n")
    repo = pygit2.init_repository(str(tmp_path / "source.git"), bare=True, initial_head="main")
    commit_tree(repo, source, "first")
    result = CliRunner().invoke(cli, ["diff", "--repo", str(tmp_path / "source.git"), "main", "main"])
    assert result.exit_code == 1, result.output
    assert "main: commit" in result.output and "holds no settings tree" in result.output
    assert "README.md, llmgw" in result.output and "give the settings repository with --repo" in result.output
    assert "is not a settings file" not in result.output and result.output.count("\n") == 2, result.output


def test_keys_read_only_at_start_are_named_with_llmgw_restart(tmp_path: Path) -> None:
    a, b = copy_example(tmp_path / "a"), copy_example(tmp_path / "b")
    edit(b, "llmgw.yaml", "port: 8080}", "port: 8080, workers: 2}")
    edit(b, "llmgw.yaml", "path: llmgw.sqlite3", "path: llmgw.sqlite3\n  url: postgresql://llmgw@hunter2.db/llmgw")
    edit(b, GEMMA, "replicas: 1\n", "replicas: 2\n")
    runner = CliRunner()
    result = runner.invoke(cli, ["diff", str(a), str(b)])
    assert result.exit_code == 2
    notes = [line for line in result.output.splitlines() if line.startswith("restart: ")]
    assert notes == [f"restart: {key} takes effect only when the control plane starts again: run `llmgw restart` "
                     "once this is applied" for key in ("listeners.gateway.workers", "store.url")]
    assert "hunter2" not in result.output
    as_json = json.loads(runner.invoke(cli, ["diff", "--json", str(a), str(b)]).output)
    assert as_json["restart_only"] == ["listeners.gateway.workers", "store.url"]
    only_replicas = copy_example(tmp_path / "c")
    edit(only_replicas, GEMMA, "replicas: 1\n", "replicas: 2\n")
    assert "restart" not in runner.invoke(cli, ["diff", str(a), str(only_replicas)]).output


# The keys docs/gateway.md and `RESTART_ONLY` name as read only when the control plane starts ("the listeners'
# addresses, the store and tracing:"): an edit of llmgw.yaml and the restart notes it must give, value hidden where
# secret. Written out here, not read from RESTART_ONLY, so that a key dropped there fails.
RESTART_EDITS = [
    ("gateway: {host: 127.0.0.1, port: 8080}", "gateway: {host: 0.0.0.0, port: 8080}", ["listeners.gateway.host"]),
    ("port: 8080}", "port: 9080}", ["listeners.gateway.port"]),
    ("port: 8080}", "port: 8080, workers: 4}", ["listeners.gateway.workers"]),
    ("port: 8080}", "port: 8080, drain_timeout: 5s}", ["listeners.gateway.drain_timeout"]),
    ("admin: {host: 127.0.0.1, port: 8081}", "admin: {host: 0.0.0.0, port: 8081}", ["listeners.admin.host"]),
    ("port: 8081}", "port: 9081}", ["listeners.admin.port"]),
    ("agents: {host: 127.0.0.1, port: 8082}", "agents: {host: 0.0.0.0, port: 8082}", ["listeners.agents.host"]),
    ("port: 8082}", "port: 9082}", ["listeners.agents.port"]),
    ("path: llmgw.sqlite3", "path: other.sqlite3", ["store.path"]),
    ("kind: sqlite\n  path: llmgw.sqlite3", "kind: postgresql\n  url: postgresql://llmgw@hunter2.db/llmgw",
     ["store.kind", "store.url"]),
    ("# tracing:\n#   endpoint: http://collector:4318", "tracing:\n  endpoint: http://collector:4318",
     ["tracing.endpoint"]),
    ("# tracing:\n#   endpoint: http://collector:4318\n#   sample_ratio: 1 ",
     "tracing:\n  sample_ratio: 0.5 ", ["tracing.sample_ratio"]),
    ("# tracing:\n#   endpoint: http://collector:4318\n#   sample_ratio: 1          # share of reconcile passes traced "
     "(with the starts and installs they send)\n#   sample_requests: 0.01",
     "tracing:\n  sample_requests: 0.01", ["tracing.sample_requests"]),
]
# Keys of llmgw.yaml that take effect when a commit is applied: no restart note.
LIVE_EDITS = [
    ("name: demo", "name: other"),
    ("poll_interval: 2s ", "poll_interval: 3s "),
    ("interval: 10s ", "interval: 20s "),
    ("node_lost_after: 30s", "node_lost_after: 60s"),
    ("action_timeout: 10m", "action_timeout: 20m"),
    ("action_timeout: 10m", "action_timeout: 10m\n  forecast_check_after: 2h"),
    ("stopped: false", "stopped: true"),
    ("allow_empty: false", "allow_empty: true"),
    ("max_request_body: 10Mi", "max_request_body: 20Mi"),
    ("currency: USD", "currency: EUR"),
    ("  # gpu_hour_cost: {default", "  gpu_hour_cost: {default"),
]


@pytest.fixture(scope="module")
def example_cluster(tmp_path_factory):
    return load_directory(copy_example(tmp_path_factory.mktemp("example") / "tree")).cluster


@pytest.mark.parametrize(("old", "new", "paths"), RESTART_EDITS, ids=[",".join(p) for *_e, p in RESTART_EDITS])
def test_every_key_read_only_at_start_gives_a_restart_note(tmp_path: Path, example_cluster, old, new, paths) -> None:
    from llmgw.settings import restart_only_changes

    tree = copy_example(tmp_path / "tree")
    edit(tree, "llmgw.yaml", old, new)
    changes = restart_only_changes(example_cluster, load_directory(tree).cluster)
    assert [change.path for change in changes] == paths
    assert all("hunter2" not in (change.old or "") + (change.new or "") for change in changes)


@pytest.mark.parametrize(("old", "new"), LIVE_EDITS, ids=[new.strip() for _old, new in LIVE_EDITS])
def test_a_key_applied_with_its_commit_gives_no_restart_note(tmp_path: Path, example_cluster, old, new) -> None:
    from llmgw.settings import restart_only_changes

    tree = copy_example(tmp_path / "tree")
    edit(tree, "llmgw.yaml", old, new)
    after = load_directory(tree).cluster
    assert after != example_cluster
    assert restart_only_changes(example_cluster, after) == ()


def test_the_restart_only_keys_are_the_documented_ones_and_each_has_an_edit_above() -> None:
    from llmgw.settings import RESTART_ONLY

    documented = {"listeners.gateway", "listeners.admin", "listeners.agents", "store", "tracing",
                  "tracing.sample_requests"}
    assert set(RESTART_ONLY.values()) == documented
    edited = {path for *_edit, paths in RESTART_EDITS for path in paths}
    assert all(any(path == key or path.startswith(key + ".") for path in edited) for key in documented)

"""Keys of capabilities not built yet are accepted, and `llmgw validate` says at each one that it is not acted on;
docs/settings.md says the same, from the same table (llmgw.settings.unbuilt.UNBUILT)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.settings import NOT_ACTED_ON, UNBUILT, init_repository, is_not_acted_on, load_directory
from llmgw.settings.docs import docs_path
from settings_trees import EXAMPLE


# (file, old text, new text) -> every warning it gives, as "file:line:column: key"; named "<kind> <key>" after the
# rows of UNBUILT it shows (" + " between several).
CASES = {
    "engines llama.cpp[].python_packages": (("engines.yaml", "    default: true\n    # Built", "    default: true\n    python_packages: [x]\n    # Built"),
                                            ["engines.yaml:6:5: llama.cpp[0].python_packages"]),
    "engines vllm[].mirror + engines vllm[].build_args": (("engines.yaml", "  - version: 0.11.0\n", "  - version: 0.11.0\n    mirror: /srv/mirror\n    build_args: [-DX=1]\n"),
                              ["engines.yaml:35:5: vllm[0].mirror", "engines.yaml:36:5: vllm[0].build_args"]),
    "engines sglang[].sdist": (("engines.yaml", "  - version: 0.5.3\n", "  - version: 0.5.3\n    sdist: {package: sglang, version: 0.5.3, sha256: " + "b" * 64 + "}\n"),
                               ["engines.yaml:45:5: sglang[0].sdist"]),
    "agent fabrics": (("agents/nodes/gpu-node-01.yaml", "# fabrics:", "fabrics:"), ["agents/nodes/gpu-node-01.yaml:7:1: fabrics"]),
}


def edited_example(tmp_path: Path, rel: str, old: str, new: str) -> Path:
    """A copy of the example with `old` replaced by `new` (once) in `rel`."""
    import shutil

    tree = tmp_path / "settings"
    shutil.copytree(EXAMPLE, tree)
    text = (tree / rel).read_text()
    assert old in text, f"{rel} no longer holds {old!r}: update the case"
    (tree / rel).write_text(text.replace(old, new, 1))
    return tree


def test_every_row_of_the_table_has_a_case_and_every_case_a_row() -> None:
    rows = {f"{row.kind} {row.key}" for row in UNBUILT}
    shown = {name for case in CASES for name in case.split(" + ")}
    assert shown <= rows
    # The install sources of an engine agents cannot install share one sentence: five cases show it.
    same_sentence = {f"{row.kind} {row.key}" for row in UNBUILT if row.kind == "engines"}
    assert rows - shown <= same_sentence, rows - shown


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_warns_at_each_key_not_acted_on_yet_and_still_accepts_the_tree(case: str, tmp_path: Path) -> None:
    (rel, old, new), expected = CASES[case]
    tree = edited_example(tmp_path, rel, old, new)
    result = CliRunner().invoke(cli, ["validate", str(tree)])
    assert result.exit_code == 0, result.output
    warned = [line for line in result.output.splitlines() if f"warning: {NOT_ACTED_ON}: " in line]
    assert [line.split(": warning:")[0] for line in warned] == expected, result.output
    assert f"{len(expected) + 1} warnings" in result.output  # and the example's unpinned revision


def test_values_that_are_acted_on_give_no_warning(tmp_path: Path) -> None:
    tree = edited_example(tmp_path, "firewall.yaml", "rollback_after: 60s", "rollback_after: 2m")
    settings = load_directory(tree)
    assert settings.cluster.store.kind == "sqlite" and settings.firewall.enabled is False
    assert settings.firewall.rollback_after_seconds == 120.0
    assert settings.slurm.enabled is False and not settings.cluster.gpu_hour_cost
    priced = load_directory(edited_example(tmp_path / "priced", "llmgw.yaml", "  # gpu_hour_cost: {",
                                           "  gpu_hour_cost: {"))
    assert priced.cluster.gpu_hour_cost["h100-80g"] == 2.5  # GPU-hours are priced with it: no warning
    assert not [w for w in priced.warnings if is_not_acted_on(w)]
    assert not [w for w in settings.warnings if is_not_acted_on(w)]


def test_validate_json_lists_the_keys_not_acted_on_with_their_place(tmp_path: Path) -> None:
    tree = edited_example(tmp_path, "agents/nodes/gpu-node-01.yaml", "# fabrics:", "fabrics:")
    result = CliRunner().invoke(cli, ["validate", "--json", str(tree)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["valid"] is True
    [place] = document["not_acted_on"]
    assert (place["file"], place["key"]) == ("agents/nodes/gpu-node-01.yaml", "fabrics")
    [issue] = [i for i in document["issues"] if i["file"] == place["file"] and i["severity"] == "warning"]
    assert issue["reason"].startswith("accepted, not acted on yet: nothing reads this key")


def test_validate_json_of_an_invalid_tree_still_lists_the_keys_not_acted_on(tmp_path: Path) -> None:
    tree = edited_example(tmp_path, "agents/nodes/gpu-node-01.yaml", "# fabrics:", "fabrics:")
    (tree / "slurm.yaml").write_text((tree / "slurm.yaml").read_text() + "bogus: 1\n")
    result = CliRunner().invoke(cli, ["validate", "--json", str(tree)])
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert document["valid"] is False
    assert document["not_acted_on"] == [{"file": "agents/nodes/gpu-node-01.yaml", "line": 7, "column": 1,
                                         "key": "fabrics"}]


@pytest.mark.parametrize("row", UNBUILT, ids=lambda row: f"{row.kind} {row.key}")
def test_the_settings_reference_says_each_key_is_accepted_not_acted_on_yet(row) -> None:
    lines = [line for line in docs_path().read_text().splitlines() if line.startswith(f"| `{row.key}` |")]
    assert any("**Accepted, not acted on yet**" in line and row.instead in line for line in lines), row.key


def test_a_push_setting_a_key_not_acted_on_is_accepted_and_the_pusher_is_told(tmp_path: Path) -> None:
    bare = tmp_path / "settings.git"
    init_repository(bare, EXAMPLE)
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", str(bare), str(work)], check=True)
    node = work / "agents" / "nodes" / "gpu-node-01.yaml"
    node.write_text(node.read_text().replace("# fabrics:", "fabrics:"))
    git = ["git", "-c", "user.name=Operator", "-c", "user.email=operator@acme.example"]
    subprocess.run([*git, "commit", "-qam", "fabrics"], cwd=work, check=True)
    pushed = subprocess.run([*git, "push", "origin", "main"], cwd=work, capture_output=True, text=True)
    assert pushed.returncode == 0, pushed.stderr
    assert ("remote:   agents/nodes/gpu-node-01.yaml:7:1: fabrics: warning: accepted, not acted on yet: nothing reads "
            "this key") in pushed.stderr

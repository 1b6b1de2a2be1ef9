"""`llmgw model replicas` and `llmgw model adapter add|remove` against a running control plane (no agent): each is
a commit to the model's catalog file authored as given, `--diff` shows it first and commits nothing, and what
validate refuses is said with the file and line."""

from __future__ import annotations

import pygit2
import trio

from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import load_commit

from .test_cli_over_admin_api import llmgw

WHO = ("--author-name", "Ada", "--author-email", "ada@example.com")
SHA = "e" * 64


def head(repo) -> pygit2.Commit:
    return pygit2.Repository(str(repo)).references["refs/heads/main"].peel(pygit2.Commit)


async def test_a_models_replicas_and_adapters_are_commits_shown_first_with_diff(tmp_path, settings_repo):
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", gateway=False))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        before = head(settings_repo).id
        code, out, err = await llmgw(plane, "model", "replicas", "tiny", "2", "--diff", *WHO)
        assert code == 0 and "catalog/tiny.yaml" in out, out + err
        assert [line for line in out.splitlines() if line[:1] in "+-" and line[:4] not in ("--- ", "+++ ")] == [
            "-replicas: 1", "+replicas: 2"]  # the edit alone: the file's layout is kept
        assert head(settings_repo).id == before  # shown, not committed

        code, out, err = await llmgw(plane, "model", "replicas", "tiny", "--min", "1", "--max", "3", *WHO)
        assert code == 0 and "tiny: 1 to 3 replicas (settings commit" in out, out + err
        assert (head(settings_repo).author.name, head(settings_repo).message) == (
            "Ada", "llmgw model tiny: replicas 1..3\n")
        code, out, err = await llmgw(plane, "model", "replicas", "tiny", "--min", "4", "--max", "2", *WHO)
        assert code == 1 and "catalog/tiny.yaml:" in err, out + err

        code, out, err = await llmgw(plane, "model", "adapter", "add", "tiny", "tiny-pirate",
                                     f"https://example.invalid/tiny/pirate.gguf={SHA}", *WHO)
        assert code == 0 and "tiny: adapter tiny-pirate added" in out, out + err
        assert [a.name for a in load_commit(str(settings_repo)).models["tiny"].adapters] == ["tiny-pirate"]
        code, out, err = await llmgw(plane, "model", "adapter", "remove", "tiny", "tiny-pirate", *WHO)
        assert code == 0 and load_commit(str(settings_repo)).models["tiny"].adapters == ()
        code, out, err = await llmgw(plane, "model", "replicas", "tiny", "2", "--min", "1", *WHO)
        assert code == 1 and "not both" in err
        nursery.cancel_scope.cancel()

"""A real control plane with an in-process agent (memory link) running the llama-server stand-in: pushes are
placed, served, scaled to 0, and bad commits are kept out, all recorded as audit commits."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pygit2
import trio

from llmgw.agent import run_agent
from llmgw.control import ControlConfig, ControlPlane, sign_webhook
from llmgw.settings import read_audit_log

from .conftest import git, stand_in_agent


async def wait_for(check, timeout: float, what: str, show=None):
    with trio.move_on_after(timeout):
        while True:
            value = check()
            if value:
                return value
            await trio.sleep(0.05)
    detail = f"\n{json.dumps(show(), indent=1, default=str)}" if show else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}{detail}")


def replica_states(plane: ControlPlane) -> dict[str, str]:
    return {rid: r["state"] for rid, r in plane.status()["replicas"].items()}


async def push_catalog(workdir: Path, repo: Path, edit, message: str) -> None:
    """Clone `repo`, apply `edit(checkout)`, commit and `git push` (hooks run), all with the git CLI."""
    def run() -> None:
        if not workdir.exists():
            git("clone", "-q", str(repo), str(workdir), cwd=repo.parent)
        git("pull", "-q", "origin", "main", cwd=workdir)
        edit(workdir)
        git("commit", "-qam", message, cwd=workdir)
        git("push", "-q", "origin", "HEAD:main", cwd=workdir)
    await trio.to_thread.run_sync(run)


def set_replicas(n: int):
    def edit(checkout: Path) -> None:
        path = checkout / "catalog" / "tiny.yaml"
        text = path.read_text()
        lines = [f"replicas: {n}" if line.startswith("replicas:") else line for line in text.splitlines()]
        path.write_text("\n".join(lines) + "\n")
    return edit


def commit_directly(repo_path: Path, path: str, content: bytes, message: str, branch: str = "main") -> str:
    """A commit on `branch` (made from main) written without hooks, as a forge without pre-receive would."""
    repo = pygit2.Repository(str(repo_path))
    head = repo.references["refs/heads/main"].peel(pygit2.Commit)
    builder = repo.TreeBuilder(head.tree)
    folder, _, name = path.rpartition("/")
    sub = repo.TreeBuilder(head.tree[folder]) if folder else None
    blob = repo.create_blob(content)
    if sub is not None:
        sub.insert(name, blob, pygit2.enums.FileMode.BLOB)
        builder.insert(folder, sub.write(), pygit2.enums.FileMode.TREE)
    else:
        builder.insert(name, blob, pygit2.enums.FileMode.BLOB)
    sig = pygit2.Signature("Forge", "forge@example.com")
    return str(repo.create_commit(f"refs/heads/{branch}", sig, sig, message, builder.write(), [head.id]))


async def test_pushes_are_placed_served_scaled_to_zero_and_bad_commits_kept_out(
    tmp_path, settings_repo, weights_mirror, fake_engine,
):
    mirror, _sha = weights_mirror
    (tmp_path / "state" / "secrets").mkdir(parents=True)
    (tmp_path / "state" / "secrets" / "webhook").write_text("hook-secret\n")
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        agent = stand_in_agent("n1", tmp_path / "agent", mirror, fake_engine)
        await nursery.start(run_agent, agent, plane.local_connector())
        await wait_for(lambda: replica_states(plane).get("tiny-0") == "ready", 30, "tiny-0 ready")

        # served through the gateway under its alias, with the replica key the plane derived
        _record, api_key = plane.store.create_api_key("demo")
        async with httpx.AsyncClient(base_url=plane.gateway_url, timeout=10) as client:
            await wait_for(lambda: plane.table.models["tiny"].replicas, 5, "a route to tiny")
            reply = await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                                      json={"model": "tiny-alias", "messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 4})
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"]

        # a git push (post-receive hook -> admin API) scaling to 2 gives a second ready replica
        checkout = tmp_path / "checkout"
        await push_catalog(checkout, settings_repo, set_replicas(2), "tiny: 2 replicas")
        await wait_for(lambda: replica_states(plane) == {"tiny-0": "ready", "tiny-1": "ready"}, 30, "2 ready")
        await wait_for(lambda: plane.audit.applied == plane.snapshot().watch.settings.commit, 10, "applied ref")

        # scaling to 0 is held back by the empty-catalog guard until allow_empty is set, then stops both engines
        await push_catalog(checkout, settings_repo, set_replicas(0), "tiny: 0 replicas")
        await wait_for(lambda: plane.snapshot().watch.held is not None, 10, "the emptying commit held")
        assert "allow_empty" in plane.status()["settings"]["held"]["issues"][0]["reason"]
        assert replica_states(plane) == {"tiny-0": "ready", "tiny-1": "ready"}
        await plane.wait_pass()
        await plane.loop.effects_handled()  # the pass's audit commit is queued by its effects, after the pass
        snapshots = plane.audit.pending() + plane.audit.written
        await plane.wait_pass()  # an idle pass with nothing changed (the interval's timer: 2 s) writes no audit commit
        await plane.loop.effects_handled()
        assert plane.audit.pending() + plane.audit.written == snapshots

        def allow_empty(checkout: Path) -> None:
            path = checkout / "llmgw.yaml"
            path.write_text(path.read_text().replace("allow_empty: false", "allow_empty: true"))
        await push_catalog(checkout, settings_repo, allow_empty, "allow an empty catalog")
        await wait_for(lambda: all(s == "stopped" for s in replica_states(plane).values()) or
                       not replica_states(plane), 30, "replicas stopped", plane.status)
        good = plane.snapshot().watch.settings.commit

        # a commit that does not validate, accepted by a forge without our pre-receive hook, is never applied
        bad = commit_directly(settings_repo, "catalog/tiny.yaml", b"name: tiny\nengine: llama.cpp\nreplicas: many\n",
                              "break the catalog")
        body = json.dumps({"ref": "refs/heads/main", "after": bad}).encode()
        async with httpx.AsyncClient(base_url=plane.admin_url, timeout=10) as admin:
            refused = await admin.post("/api/v1/hooks/git", content=body,
                                       headers={"X-Hub-Signature-256": sign_webhook(b"wrong", body)})
            assert refused.status_code == 401
            woke = await admin.post("/api/v1/hooks/git", content=body,
                                    headers={"X-Hub-Signature-256": sign_webhook(b"hook-secret", body)})
            assert woke.status_code == 202
            await wait_for(lambda: plane.snapshot().watch.bad is not None, 5, "the bad commit noticed")
            status = (await admin.get("/api/v1/status",
                                      headers={"Authorization": f"Bearer {plane.admin_token}"})).json()
        assert status["settings"]["commit"] == good
        assert status["settings"]["bad"]["commit"] == bad
        issue = status["settings"]["bad"]["issues"][0]
        assert issue["file"] == "catalog/tiny.yaml" and issue["line"] == 3 and issue["reason"]

        await plane.audit.flush(10)
        entries = await trio.to_thread.run_sync(read_audit_log, str(settings_repo), 100)
        assert len(entries) >= 3
        messages = "\n".join(e.message for e in entries)
        assert "start tiny-1/0 on n1" in messages and "stop tiny-0/0 on n1" in messages
        log = await trio.to_thread.run_sync(lambda: git("log", "--format=%s", "refs/llmgw/audit", cwd=settings_repo))
        assert "pass " in log
        # no replica key ever enters a commit
        everything = await trio.to_thread.run_sync(
            lambda: git("log", "-p", "--format=%B", "refs/llmgw/audit", cwd=settings_repo))
        assert "status.yaml" in everything and "tiny-1/0" in everything
        assert plane.replica_key("tiny-0") not in everything and plane.replica_key("tiny-1") not in everything
        nursery.cancel_scope.cancel()

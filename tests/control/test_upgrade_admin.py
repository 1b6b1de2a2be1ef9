"""`llmgw upgrade`'s admin routes on a real control plane (in process, with a stand-in agent): a release signed by a
key of releases.trusted_keys is taken and rolled out (its progress in the status document and `llmgw status`);
one of another key is refused naming it, one newer than the control plane too (control planes first); an agent without the "upgrade" feature is named (pure); pause
and resume with no upgrade under way are refused with a sentence. The rollout itself is test_upgrade_rollout.py's,
the agents' install and rollback test_upgrade_fleet.py's."""

from __future__ import annotations

import io
import tarfile
import httpx
import trio

import llmgw

from llmgw.agent import run_agent
from llmgw.cli.server_cmds import render_status
from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.upgrade_run import version_refusal
from llmgw.release import MANIFEST, SIGNATURE, Manifest, keygen, read_public_key, read_secret_key
from llmgw.release.manifest import describe, write_signed_manifest
from llmgw.settings import init_repository

from .conftest import stand_in_agent, write_seed
from .loop_world import control_state
from .test_in_process_fleet import wait_for


def _release_tar(root, version: str) -> tuple[bytes, str]:
    """A tiny signed release of `version` as `llmgw upgrade` sends it (a tar), and its key line."""
    secret, public = keygen(root / "keys")
    directory = root / "release"
    (directory / "wheels").mkdir(parents=True)
    (directory / "wheels" / f"llmgw-{version}-py3-none-any.whl").write_bytes(b"stand-in")
    files = describe(directory, [f"wheels/llmgw-{version}-py3-none-any.whl"])
    write_signed_manifest(directory, Manifest("llmgw", version, "2026-01-01T00:00:00Z", "3.11", "x", files),
                          read_secret_key(secret), "test")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in (MANIFEST, SIGNATURE, files[0].path):
            tar.add(directory / name, arcname=name)
    return buffer.getvalue(), read_public_key(public).line


async def test_upgrade_routes_take_a_trusted_release_and_refuse_what_they_cannot_do(
        tmp_path, weights_mirror, fake_engine, monkeypatch):
    tar, key = _release_tar(tmp_path / "ours", "0.2.0")
    stranger, _ = _release_tar(tmp_path / "theirs", "0.2.0")
    seed = write_seed(tmp_path / "seed", weights_mirror[1], replicas=0)
    with open(seed / "llmgw.yaml", "a") as file:
        file.write(f"releases:\n  trusted_keys:\n    - {key}\n")
    init_repository(tmp_path / "settings.git", seed)
    plane = ControlPlane(ControlConfig(repo=str(tmp_path / "settings.git"), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        agent = stand_in_agent("n1", tmp_path / "agent", weights_mirror[0], fake_engine)
        nursery.start_soon(run_agent, agent, plane.local_connector())
        await wait_for(lambda: plane.is_connected("n1"), 30, "n1 connected")
        auth = {"Authorization": f"Bearer {plane.admin_token}"}
        async with httpx.AsyncClient(base_url=plane.admin_url, headers=auth, timeout=30) as admin:
            for verb in ("pause", "resume"):
                answer = await admin.post(f"/api/v1/upgrade/{verb}")
                assert answer.status_code == 409
                assert answer.json()["error"]["message"] == ("no upgrade is under way (`llmgw status` shows the "
                                                             "last one)")
            refused = await admin.post("/api/v1/upgrade", content=stranger)
            assert refused.status_code == 409
            assert refused.json()["error"]["message"].startswith("the release does not check: ")
            assert "which is not trusted" in refused.json()["error"]["message"]

            newer = await admin.post("/api/v1/upgrade", content=tar)  # this control plane runs 0.1.0
            assert newer.status_code == 409
            assert newer.json()["error"]["message"] == (
                "the release is llmgw 0.2.0, newer than this control plane's llmgw 0.1.0: upgrade the control planes "
                "first (the standbys, then the leader; docs/operations.md), then run `llmgw upgrade` against the new "
                "leader")
            assert plane.snapshot().upgrade is None
            monkeypatch.setattr(llmgw, "__version__", "0.2.0")  # as if this control plane were upgraded first

            started = await admin.post("/api/v1/upgrade", params={"max_unavailable": 1, "paused": 1}, content=tar)
            assert started.status_code == 200, started.text
            upgrade = started.json()["upgrade"]
            assert (upgrade["version"], upgrade["state"]) == ("0.2.0", "paused")
            assert [(n["node"], n["phase"]) for n in upgrade["nodes"]] == [("n1", "waiting")]
            again = await admin.post("/api/v1/upgrade", content=tar)
            assert again.status_code == 409 and "an upgrade to llmgw 0.2.0 is under way" in again.text
            await plane.loop.folded_all()
            status = (await admin.get("/api/v1/status")).json()
            assert status["upgrade"]["state"] == "paused" and status["upgrade"]["counts"] == {"waiting": 1}
            assert "upgrade     to llmgw 0.2.0: paused (1 waiting): paused at the start" in render_status(status)
            resumed = await admin.post("/api/v1/upgrade/resume")
            assert resumed.json()["upgrade"]["state"] == "running"
            # The stand-in agent runs from a checkout, not a release install: it refuses, and the upgrade fails so.
            await wait_for(lambda: plane.snapshot().upgrade.ended, 30, "the upgrade to end")
            final = (await admin.get("/api/v1/status")).json()["upgrade"]
            assert final["state"] == "failed"
            assert final["reason"].startswith("node n1: this agent does not run from a release installed as "
                                              "`llmgw node add` installs it")
        nursery.cancel_scope.cancel()


def test_an_agent_without_the_upgrade_feature_is_named_with_its_version():
    from llmgw.control.upgrade_run import upgrade_refusal
    from llmgw.plan.types import NodeState

    old = control_state(None, NodeState("old-node"), acked=False, features=("adopt", "restart"))
    assert upgrade_refusal(old) == (
        "the agents of old-node (0.1.0) cannot upgrade over their stream: upgrade them on the node (`llmgw node add` "
        "again), then run `llmgw upgrade`")
    assert upgrade_refusal(control_state(None, NodeState("new"), acked=False, features=("upgrade",))) is None


def test_a_release_newer_than_the_control_plane_is_refused_and_the_same_or_older_is_not():
    assert version_refusal("0.1.2", "0.1.1").startswith("the release is llmgw 0.1.2, newer than this control plane's")
    assert version_refusal("0.10.0", "0.9.3") is not None  # numbers, not text
    assert version_refusal("0.1.1", "0.1.1") is None
    assert version_refusal("0.1.0", "0.1.1") is None
    assert version_refusal("0.2.0rc1", "0.2.0") is None
    assert version_refusal("nightly", "0.1.1") is None  # nothing to compare

"""Canary rollouts against a real control plane, its gateway and store, an in-process agent running the llama-server
stand-in, and a real settings repository (pushes with the git CLI, hooks running).

A model of two replicas says `rollout: canary` and its change restarts replicas (an engine argument):
- a slow new revision (the stand-in waits 0.4 s before every answer) takes half the requests beside the old
  replicas, misses TTFT p90 200 ms, and is stopped: the old replicas keep serving, the applied ref stays, the audit
  commit says why, and a revert of the commit waits on the branch `llmgw/revert-<commit>` (main untouched);
- a good one (no delay) holds its SLOs over the window and the rest of the model rolls out;
- `llmgw canaries --post github` sets the failed canary's commit status (a stand-in forge on loopback);
- `llmgw plan --at` makes the plan of every pass a canary held back again, byte for byte (the audit records it).

Streamed requests go through the gateway the whole time (a client of the openai wire format over loopback).
Time: about 20 s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pygit2
import trio

from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.cli.server_cmds import render_status
from llmgw.control import ControlPlane
from llmgw.plan import PASS_FILE
from llmgw.settings import APPLIED_REF, read_audit_chain, read_audit_log

from .test_in_process_fleet import push_catalog, replica_states, set_replicas, wait_for
from .test_reviewed_rollout import head, llmgw, serving_one_replica

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan"))
from forge_stand_in import TOKEN, running_forge  # noqa: E402  (the forges' stand-in of the review tests)

MARK = "# canary test\n"


def canary_revision(first_token_delay: float):
    """A catalog edit: the stand-in started with `--fake-first-token-delay` (a change that restarts replicas) and a
    canary rollout: half the requests, a 2 s window, at least 3 requests, TTFT p90 at most 200 ms."""
    def edit(checkout: Path) -> None:
        path = checkout / "catalog" / "tiny.yaml"
        text = path.read_text().split(MARK)[0]
        path.write_text(text + MARK + f'engine_args: ["--fake-first-token-delay", "{first_token_delay}"]\n'
                        "rollout:\n  strategy: canary\n  share: 0.5\n  window: 2s\n  min_requests: 3\n"
                        "  slo: {error_rate: 0.05, ttft_p90: 200ms}\n")
    return edit


async def send_traffic(url: str, api_key: str, answered: list[int]) -> None:
    """Streamed chat completions to tiny, one after the other, until cancelled; each answer's status into
    `answered`."""
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while True:
            async with client.stream("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                                     json={"model": "tiny", "stream": True, "max_tokens": 4,
                                           "messages": [{"role": "user", "content": f"hi {len(answered)}"}]}) as reply:
                await reply.aread()
                answered.append(reply.status_code)
            await trio.sleep(0.02)


def canary_of(plane: ControlPlane) -> dict:
    return plane.status().get("canaries", {}).get("tiny", {})


def running_fingerprints(plane: ControlPlane) -> dict[str, str]:
    """{shard id: fingerprint} of tiny's shards not stopped."""
    return {s.shard_id: s.fingerprint for r in plane.snapshot().fleet.records() for s in r.state.shards
            if s.model == "tiny" and s.state.value != "stopped"}


async def test_a_slow_canary_is_rolled_back_with_its_reason_and_a_good_one_rolls_out(
    tmp_path, settings_repo, weights_mirror, fake_engine,
):
    mirror, _sha = weights_mirror
    checkout = tmp_path / "checkout"
    answered: list[int] = []
    async with trio.open_nursery() as nursery:
        plane = await serving_one_replica(nursery, tmp_path, settings_repo, mirror, fake_engine)
        await push_catalog(checkout, settings_repo, set_replicas(2), "tiny: 2 replicas")
        await wait_for(lambda: replica_states(plane) == {"tiny-0": "ready", "tiny-1": "ready"}, 30, "2 ready")
        old = running_fingerprints(plane)
        before = head(settings_repo)
        await wait_for(lambda: plane.audit.applied == before, 10, "the 2 replicas applied")
        _record, api_key = plane.store.create_api_key("demo")
        nursery.start_soon(send_traffic, plane.gateway_url, api_key, answered)

        # a slow revision: its canary takes half the requests beside the old replicas, then fails
        await push_catalog(checkout, settings_repo, canary_revision(0.4), "tiny: slow prompt processing")
        slow = head(settings_repo)
        await wait_for(lambda: (plane.table.models["tiny"].canary_share == 0.5
                                and len(plane.table.models["tiny"].replicas) == 3), 30, "the canary routed",
                       lambda: plane.table.models["tiny"])
        replicas = sorted(r.replica_id for r in plane.table.models["tiny"].replicas)
        assert replicas == ["tiny-0", "tiny-0@canary", "tiny-1"]
        await wait_for(lambda: canary_of(plane).get("phase") == "failed", 30, "the canary's verdict", plane.status)
        canary = canary_of(plane)
        assert canary["commit"] == slow and canary["previous_commit"] == before
        assert f"canary      canary of tiny at {slow[:12]} (tiny-0, 0.5 of requests) failed: TTFT p90" in "\n".join(
            render_status(plane.status()))  # `llmgw status`
        assert "TTFT p90" in canary["reason"] and "above the SLO's 200 ms" in canary["reason"], canary
        assert canary["requests"] >= 3 and canary["ttft_p90_seconds"] >= 0.4

        # stopped; the old replicas serve on, unchanged; main keeps the commit; the applied ref does not move to it
        await wait_for(lambda: running_fingerprints(plane) == old and not any(
            r.canary for r in plane.table.models["tiny"].replicas), 30, "the canary stopped",
            lambda: running_fingerprints(plane))
        await wait_for(lambda: canary_of(plane).get("revert_branch"), 10, "the revert proposed", canary_of)
        branch = f"llmgw/revert-{slow[:12]}"
        assert canary_of(plane)["revert_branch"] == branch
        repo = pygit2.Repository(str(settings_repo))
        revert = repo.references[f"refs/heads/{branch}"].peel(pygit2.Commit)
        assert [str(p) for p in revert.parent_ids] == [slow]
        assert revert.tree.id == repo[before].peel(pygit2.Commit).tree.id  # the settings before the slow commit
        assert "TTFT p90" in revert.message and f"This reverts commit {slow}." in revert.message
        assert head(settings_repo) == slow
        assert str(repo.references[APPLIED_REF].target) == before
        await plane.audit.flush(10)
        entries = await trio.to_thread.run_sync(read_audit_log, str(settings_repo), 100)
        failed = [e for e in entries if f"canary of tiny at {slow[:12]}" in e.message and "failed" in e.message
                  and branch in e.message]
        assert failed, [e.message for e in entries[:5]]
        stopped = [e for e in entries if "stop tiny-0/0@" in e.message and "canary of" in e.message]
        assert stopped, [e.message for e in entries[:5]]
        (tmp_path / "audit-failed.txt").write_text(failed[-1].message)  # the entry docs/review.md shows

        # CI marks the commit: `llmgw canaries --post github`, with a review-scope token (it reads the status only)
        _token, review_token = plane.store.create_token("review", "ci-review")
        with running_forge("github") as forge:
            result = await trio.to_thread.run_sync(lambda: CliRunner().invoke(cli, [
                "canaries", "--post", "github", "--forge-url", forge.url, "--forge-repo", "ops/settings",
                "--url", plane.admin_url, "--token", review_token], env={"LLMGW_FORGE_TOKEN": TOKEN}))
            assert result.exit_code == 0, result.output
            assert f"canary of tiny at {slow[:12]} (tiny-0, 0.5 of requests) failed: TTFT p90" in result.output
            assert f"posted llmgw/canary failure on {slow[:12]} (canary of tiny)" in result.output
            (status,) = forge.statuses[("ops/settings", slow)]
            assert (status["context"], status["state"]) == ("llmgw/canary", "failure")
            assert "TTFT p90" in status["description"]

        # a good revision: its canary holds, and the rest of the model rolls out
        await push_catalog(checkout, settings_repo, canary_revision(0), "tiny: no delay")
        good = head(settings_repo)
        await wait_for(lambda: canary_of(plane).get("commit") == good and canary_of(plane).get("phase") == "held",
                       40, "the good canary's verdict", plane.status)
        assert "within the SLO" in canary_of(plane)["reason"]
        await wait_for(lambda: plane.audit.applied == good, 30, "the rest rolled out", plane.status)
        new = running_fingerprints(plane)
        assert len(new) == 2 and not set(new.values()) & set(old.values()) and len(set(new.values())) == 1
        assert sorted(r.replica_id for r in plane.table.models["tiny"].replicas) == ["tiny-0", "tiny-1"]
        await plane.audit.flush(10)
        nursery.cancel_scope.cancel()
    assert answered and all(status == 200 for status in answered), answered

    held_back = [(audit, json.loads(data)) for audit, data in read_audit_chain(str(settings_repo), PASS_FILE)
                 if data is not None and "canaries" in json.loads(data)]
    assert any(r["canaries"]["tiny"]["failed"] for _, r in held_back) and any(
        not r["canaries"]["tiny"]["failed"] for _, r in held_back), held_back
    for audit, record in held_back:
        code, out = await llmgw("plan", "--at", audit[:12], "--repo", str(settings_repo), "--json")
        assert code in (0, 2) and json.loads(out)["reproduced"], (record, out)

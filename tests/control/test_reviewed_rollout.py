"""From review to rollout, against a real control plane with in-process agents running the llama-server stand-in and
a real settings repository (pushes with the git CLI, hooks running):

- every audit commit carries the fleet its pass planned from, and `llmgw plan --at` makes that pass's plan again,
  byte for byte, though the fleet changed in between; `llmgw diff --at REV` plans REV against the fleet it was
  applied to; an unchanged fleet is one blob however many audit commits carry it;
- `llmgw apply --expect REV` refuses a head that is not REV and names the commits since; with the head (here from
  a review's JSON, `--review`), it applies, and the audit records how the passes compare with the reviewed plan;
- reverting a settings commit restores the replicas and routes of the commit before it.

The `llmgw` commands run in-process (click's runner, in a worker thread while the control plane serves).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pygit2
import trio
from click.testing import CliRunner

from llmgw.agent import run_agent
from llmgw.cli.main import cli
from llmgw.control import ControlConfig, ControlPlane
from llmgw.errors import LlmgwError
from llmgw.plan import PASS_FILE, fleet_from_record, plan_digest, plan_or_refusal
from llmgw.settings import AUDIT_REF, load_commit, read_audit_chain, read_audit_file

from .conftest import git, stand_in_agent
from .test_in_process_fleet import push_catalog, replica_states, set_replicas, wait_for


async def llmgw(*args: str) -> tuple[int, str]:
    """Run `llmgw ARGS` in-process in a worker thread: (exit code, stdout and stderr); an LlmgwError is exit 1 and
    "error: ..." as `llmgw.cli.main.main` prints it."""
    result = await trio.to_thread.run_sync(lambda: CliRunner().invoke(cli, list(args)))
    if isinstance(result.exception, LlmgwError):
        return 1, result.output + f"error: {result.exception}\n"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def head(repo: Path) -> str:
    return str(pygit2.Repository(str(repo)).references["refs/heads/main"].target)


def with_price(prompt: float):
    def edit(checkout: Path) -> None:
        path = checkout / "catalog" / "tiny.yaml"
        text = path.read_text().split("prices:")[0].rstrip("\n")
        path.write_text(f"{text}\nprices:\n  prompt_per_million: {prompt}\n  completion_per_million: 2.0\n")
    return edit


def both(*edits):
    def edit(checkout: Path) -> None:
        for one in edits:
            one(checkout)
    return edit


def served(plane: ControlPlane) -> tuple[dict, dict]:
    """(replicas: {replica id: (node, state, {shard id: fingerprint})}, routes: {model: its route}) now, leaving out
    what names the settings commit (a revert is a new commit with the same settings)."""
    fleet = plane.snapshot().fleet
    shards = {s.shard_id: s.fingerprint for r in fleet.records() for s in r.state.shards if not s.adopted_foreign}
    replicas = {rid: (r.get("node"), r["state"], {sid: shards.get(sid) for sid in r["shards"]})
                for rid, r in plane.status()["replicas"].items() if r["state"] != "stopped"}
    routes = {name: replace(route, created=0, replicas=tuple(sorted(
        (replace(r, settings_commit=None) for r in route.replicas), key=lambda r: r.replica_id)))
        for name, route in plane.table.models.items()}
    return replicas, routes


async def serving_one_replica(nursery: trio.Nursery, tmp_path: Path, settings_repo: Path, mirror: Path,
                              fake_engine: Path) -> ControlPlane:
    """A control plane on `settings_repo` (one replica of tiny) with agent n1 connected, once tiny-0 is ready. Its
    passes and audit commits are spaced 0.05 s and 0.1 s apart (`PASS_COALESCE` 0.25 s and `AUDIT_MIN_GAP` 1 s in
    production: spacing that saves a large fleet's CPU, which these tests would only wait out)."""
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state"))
    plane.loop.coalesce = 0.05
    plane.audit.min_gap = 0.1
    await nursery.start(plane.run)
    await nursery.start(run_agent, stand_in_agent("n1", tmp_path / "a1", mirror, fake_engine), plane.local_connector())
    await wait_for(lambda: replica_states(plane) == {"tiny-0": "ready"}, 30, "tiny-0 ready")
    return plane


async def audit_drained(plane: ControlPlane) -> None:
    """Every pass run so far is written to the audit, so the passes of the next settings commit get commits of their
    own (queued passes share one commit, which records the newest one's plan: under load, the passes of a commit
    that was replaced at once were written with the next one's)."""
    await plane.loop.effects_handled()
    await wait_for(lambda: plane.audit.pending() == 0, 10, "the audit written")


async def test_plan_at_makes_three_past_passes_plans_again_from_fleets_that_changed_in_between(
    tmp_path, settings_repo, weights_mirror, fake_engine,
):
    mirror, _sha = weights_mirror
    checkout = tmp_path / "checkout"
    async with trio.open_nursery() as nursery:
        plane = await serving_one_replica(nursery, tmp_path, settings_repo, mirror, fake_engine)
        await nursery.start(run_agent, stand_in_agent("n2", tmp_path / "a2", mirror, fake_engine),
                            plane.local_connector())
        await wait_for(lambda: plane.is_connected("n2"), 10, "n2 connected")
        await audit_drained(plane)
        await push_catalog(checkout, settings_repo, set_replicas(2), "tiny: 2 replicas")
        two = head(settings_repo)
        await wait_for(lambda: replica_states(plane) == {"tiny-0": "ready", "tiny-1": "ready"}, 30, "2 ready")
        await audit_drained(plane)
        await push_catalog(checkout, settings_repo, set_replicas(3), "tiny: 3 replicas")
        await wait_for(lambda: set(replica_states(plane).values()) == {"ready"} and len(replica_states(plane)) == 3,
                       30, "3 ready")
        await audit_drained(plane)
        await push_catalog(checkout, settings_repo, with_price(1.5), "tiny: a price")  # the fleet does not change
        priced = head(settings_repo)
        await wait_for(lambda: plane.status()["settings"]["commit"] == priced, 10, "the price in force")
        await audit_drained(plane)  # the price's pass queues its audit commit by its effects, after the pass (a full
        await wait_for(lambda: plane.audit.written, 10, "the audit written")  # run once missed it: 3 commits of 4)
        await plane.audit.flush(10)
        nursery.cancel_scope.cancel()

    repo = str(settings_repo)
    chain = [(audit, json.loads(data)) for audit, data in read_audit_chain(repo, PASS_FILE) if data is not None]
    assert chain, "no audit commit records its plan"
    answers = {}
    for audit, record in chain:
        code, out = await llmgw("plan", "--at", audit[:12], "--repo", repo, "--json")
        answer = json.loads(out)
        assert code in (0, 2) and answer["reproduced"], out
        assert answer["plan_digest"] == answer["recorded_digest"] == record["plan"]
        answers[audit] = answer
    # three passes (and more) planned from fleets that differ, and made plans that differ, all made again exactly
    assert len({(a["fleet"], a["plan_digest"]) for a in answers.values()}) >= 3, answers
    assert len({a["settings_commit"] for a in answers.values()}) == 4  # 1, 2 and 3 replicas, then the price

    # the recorded fleet is what made the plan: the first pass's settings against the last fleet plan otherwise
    first_audit, first_record = chain[-1]
    repository = pygit2.Repository(repo)
    last_fleet = fleet_from_record(repository[repository.revparse_single(f"{AUDIT_REF}:plan/fleet.json").id].data)
    today, _ = plan_or_refusal(load_commit(repo, first_record["settings_commit"]), last_fleet, False)
    assert plan_digest(today) != first_record["plan"]

    code, out = await llmgw("plan", "--at", first_audit, "--repo", repo)
    assert code == 2 and f"audit commit {first_audit[:12]}" in out and "reproduced" in out, out
    # (before n1 registered, or as it did)
    assert "start tiny-0/0 on n1" in out or "cannot place tiny-0: all nodes: no nodes are registered" in out, out

    # diff --at: the 2-replica commit against the fleet of the first pass that planned it
    code, out = await llmgw("diff", "--at", two[:12], "--repo", repo, "--json")
    answer = json.loads(out)
    assert code in (0, 2), out
    assert answer["audit_commit"] == next(a for a, r in reversed(chain) if r["settings_commit"] == two)
    assert answer["reproduced"] and {a["replica_id"] for a in answer["plan"]["assignments"]} == {"tiny-0", "tiny-1"}

    # the price commit changed no node: its audit commit's fleet is the very blob of the commit before it
    priced_audit = next(audit for audit, record in chain if record["settings_commit"] == priced)
    commit = repository.get(priced_audit)
    assert commit.tree["plan/fleet.json"].id == commit.parents[0].tree["plan/fleet.json"].id

    code, out = await llmgw("plan", "--at", "main", "--repo", repo)
    assert code == 1 and "is not an audit commit" in out, out


async def test_apply_expect_refuses_a_stale_head_naming_what_changed_and_a_revert_restores_replicas_and_routes(
    tmp_path, settings_repo, weights_mirror, fake_engine,
):
    mirror, _sha = weights_mirror
    checkout = tmp_path / "checkout"
    async with trio.open_nursery() as nursery:
        plane = await serving_one_replica(nursery, tmp_path, settings_repo, mirror, fake_engine)
        admin = ("--url", plane.admin_url, "--token", plane.admin_token)

        await push_catalog(checkout, settings_repo, set_replicas(2), "tiny: 2 replicas")
        reviewed = head(settings_repo)
        await wait_for(lambda: replica_states(plane) == {"tiny-0": "ready", "tiny-1": "ready"}, 30, "2 ready")
        await wait_for(lambda: plane.table.models["tiny"].replicas and len(plane.table.models["tiny"].replicas) == 2,
                       10, "2 routes")
        before = served(plane)

        await push_catalog(checkout, settings_repo, both(set_replicas(3), with_price(9.0)), "tiny: 3 replicas, dearer")
        unreviewed = head(settings_repo)
        code, out = await llmgw("apply", "--expect", reviewed[:12], "--timeout", "30", *admin)
        assert code == 1, out
        assert f"the settings branch head is {unreviewed[:12]}, not {reviewed[:12]}" in out, out
        assert f"{unreviewed[:12]} tiny: 3 replicas, dearer (" in out and "catalog/tiny.yaml" in out, out
        code, out = await llmgw("apply", "--expect", "no-such-rev", "--timeout", "30", *admin)
        assert code == 1 and "no-such-rev names no commit" in out, out
        review = tmp_path / "review.json"
        code, out = await llmgw("review", reviewed, unreviewed, "--repo", str(settings_repo), "--admin",
                                plane.admin_url, "--token", plane.admin_token, "--json-file", str(review))
        assert code == 2, out
        code, out = await llmgw("apply", "--review", str(review), "--timeout", "30", *admin)
        assert code == 0 and f"converged to {unreviewed[:12]}" in out, out
        assert f"as reviewed: every replica is placed where the review of {unreviewed[:12]} showed" in out, out
        await plane.audit.flush(10)
        recorded = json.loads(await trio.to_thread.run_sync(
            read_audit_file, str(settings_repo), "plan/reviewed.json"))
        assert recorded == {"commit": unreviewed, "fleet": json.loads(review.read_text())["fleet"]["revision"],
                            "differences": []}
        assert len(replica_states(plane)) == 3 and plane.table.models["tiny"].prompt_price_per_million == 9.0
        assert served(plane) != before

        await trio.to_thread.run_sync(lambda: (git("revert", "--no-edit", unreviewed, cwd=checkout),
                                               git("push", "-q", "origin", "HEAD:main", cwd=checkout)))
        revert = head(settings_repo)
        code, out = await llmgw("apply", "--expect", revert, "--timeout", "30", *admin)
        assert code == 0, out
        await wait_for(lambda: served(plane) == before, 30, "the replicas and routes before the reverted commit",
                       lambda: served(plane))
        nursery.cancel_scope.cancel()

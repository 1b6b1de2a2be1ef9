"""Only the leader lease's holder writes audit commits: a deposed leader's queued audit writes are dropped, not
written, and the log says so."""

from __future__ import annotations

import logging
import time

import trio
import trio.testing

from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.audit import AuditWriter
from llmgw.control.leading import LEASE_NAME
from llmgw.settings import read_audit_log

from .test_in_process_fleet import wait_for


def _subjects(repo) -> list[str]:
    return [entry.message.split("\n", 1)[0] for entry in read_audit_log(repo, limit=200)]


async def test_a_deposed_leader_drops_its_queued_audit_commits_and_says_so(tmp_path, settings_repo, caplog):
    caplog.set_level(logging.WARNING, logger="llmgw.control.audit")
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "a",
                                       store=str(tmp_path / "shared.sqlite3"), gateway=False, lease_seconds=3.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        assert plane.leader
        token = plane.snapshot().leadership.token
        # while it holds the lease, what it queues is written
        plane.audit.queue_audit({"nodes": {}}, "written while leading\n", token=token)
        await wait_for(lambda: "written while leading" in _subjects(settings_repo), 10, "the leader's audit commit")
        # another control plane takes the lease (this one was paused past its lease, say); this one still believes
        # it leads until its next renewal, and queues two more commits of its old term
        other = plane.store.acquire_lease(LEASE_NAME, "other-plane", 3.0, now=time.time() + 60)
        assert other == token + 1
        plane.audit.queue_audit({"nodes": {}}, "late commit of a deposed leader\n", token=token)
        plane.audit.queue_applied("0" * 40, token=token)
        await wait_for(lambda: plane.audit.pending() == 0, 10, "the queue to be emptied")
        assert plane.audit.dropped >= 2  # these two, and whatever its own passes queued meanwhile
        assert "late commit of a deposed leader" not in _subjects(settings_repo)
        said = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert said and f"of leader term {token}" in said[0] and "writes no audit commit" in said[0], said
        await wait_for(lambda: not plane.leader, 5, "the plane to notice it no longer leads")
        nursery.cancel_scope.cancel()


async def _written_by(writer: AuditWriter) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await wait_for(lambda: writer.pending() == 0, 10, "the writer's queue to be emptied")
        nursery.cancel_scope.cancel()


async def test_a_writer_fenced_out_writes_nothing_and_one_of_a_newer_term_writes_only_its_own(settings_repo):
    token = 0

    async def fence() -> int:
        return token

    writer = AuditWriter(settings_repo, fence=fence)
    writer.queue_audit({"nodes": {}}, "queued without a term\n")  # token 0: not leading writes nothing, even this
    await _written_by(writer)
    assert writer.dropped == 1 and "queued without a term" not in _subjects(settings_repo)

    token = 2  # queued in term 1 and in term 2 back to back: not coalesced into one commit of term 2
    writer.queue_audit({"nodes": {"a": 1}}, "of term one\n", token=1)
    writer.queue_audit({"nodes": {"a": 2}}, "of term two\n", token=2)
    await _written_by(writer)
    subjects = _subjects(settings_repo)
    assert writer.dropped == 2 and "of term two" in subjects and not any("term one" in s for s in subjects)


def test_writes_wait_while_the_lease_has_lapsed_and_go_once_it_is_held_again(settings_repo):
    """A leader too busy to renew lets its lease lapse; nobody else takes it, it takes it again with the same
    token (llmgw.store leases), and what it queued meanwhile is written, not dropped (on MockClock)."""
    answers = [None, None, 5]  # nobody holds the lease twice, then this control plane again (token 5)
    looks: list[float] = []

    async def fence() -> int | None:
        looks.append(trio.current_time())
        return answers.pop(0) if len(answers) > 1 else answers[0]

    async def main() -> None:
        writer = AuditWriter(settings_repo, fence=fence)
        assert await writer.write_pending() == 0 and writer.pending() == 0  # nothing queued: nothing asked
        writer.queue_audit({"nodes": {"a": 1}}, "queued before the lapse\n", token=5)
        answers.insert(0, None)
        assert await writer.write_pending() == 0 and writer.pending() == 1  # at shutdown: kept, not dropped
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            while writer.pending():
                await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
        assert writer.dropped == 0 and writer.written == 1
        assert looks[-3:] == [looks[-3], looks[-3] + 1.0, looks[-3] + 3.0]  # 1 s, then 2 s between looks

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert "queued before the lapse" in _subjects(settings_repo)

"""The audit writer keeps every pass's message through a repository that fails for a while, and spaces its commits
but not a move of the applied ref (real git, MockClock)."""

from __future__ import annotations

import time
from pathlib import Path

import pygit2
import trio
import trio.testing

from llmgw.control.audit import MAX_QUEUED, AuditWriter
from llmgw.settings import read_audit_log

PASSES = MAX_QUEUED * 2 + 50


async def test_passes_queued_while_the_repository_fails_are_all_in_the_audit_once_it_works(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    repo = tmp_path / "settings.git"  # not there yet: every write fails until it is
    writer = AuditWriter(repo, min_gap=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for number in range(PASSES):
            writer.queue_audit({"pass": number}, f"pass {number} for settings abc: start r{number}/0 on n1\n")
            await trio.sleep(0.5)
        while writer.errors == 0:  # a write runs in a thread, in real time, however far the mock clock jumped
            await trio.sleep(0.5)
        assert writer.errors > 0 and writer.written == 0 and "failed (will retry)" in writer.last_error
        assert writer.pending() <= MAX_QUEUED  # compacted, not grown without bound
        pygit2.init_repository(str(repo), bare=True)
        assert await writer.flush(600)
        nursery.cancel_scope.cancel()
    history = "".join(entry.message for entry in read_audit_log(repo, 10_000))
    missing = [n for n in range(PASSES) if f"start r{n}/0 on n1" not in history]
    assert missing == []
    assert writer.last_error is None


async def test_a_write_in_progress_is_not_disturbed_by_a_compaction(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    repo = tmp_path / "settings.git"
    pygit2.init_repository(str(repo), bare=True)
    writer = AuditWriter(repo, min_gap=0.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.queue_audit({"pass": -1}, "pass -1 for settings abc: stop first/0 on n1\n")
        await trio.testing.wait_all_tasks_blocked()  # the writer waits for its thread, writing that pass
        for number in range(PASSES):  # no await between: the queue fills and is compacted meanwhile
            writer.queue_audit({"pass": number}, f"pass {number} for settings abc: stop r{number}/0 on n1\n")
        assert await writer.flush(600)
        nursery.cancel_scope.cancel()
    history = "".join(entry.message for entry in read_audit_log(repo, 10_000))
    assert [n for n in range(PASSES) if f"stop r{n}/0 on n1" not in history] == []
    assert "stop first/0 on n1" in history



async def _written(writer: AuditWriter, count: int, seconds: float = 10.0) -> int:
    """Wait in real time (the writes run in threads; the mock clock stands still) until `writer` has written
    `count` items or `seconds` pass; returns how many it has written."""
    deadline = time.monotonic() + seconds
    while writer.written < count and time.monotonic() < deadline:
        await trio.to_thread.run_sync(time.sleep, 0.005)
    return writer.written


async def test_the_write_after_an_applied_ref_move_does_not_wait_the_gap(
        tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    """Two audit commits are `min_gap` apart; the applied ref moved between them adds no gap of its own."""
    repo = tmp_path / "settings.git"
    pygit2.init_repository(str(repo), bare=True)
    writer = AuditWriter(repo, min_gap=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.queue_audit({"pass": 1}, "pass 1 for settings abc: start a/0 on n1\n")
        assert await _written(writer, 1) == 1
        first = str(pygit2.Repository(str(repo)).references["refs/llmgw/audit"].target)
        writer.queue_applied(first)
        writer.queue_audit({"pass": 2}, "pass 2 for settings abc: start b/0 on n1\n")
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(0.999)
        await trio.testing.wait_all_tasks_blocked()
        assert writer.written == 1  # within the gap after the first commit, nothing more is written
        mock_clock.jump(0.001)
        assert await _written(writer, 3) == 3  # the ref, then the second commit, with no more time passing
        nursery.cancel_scope.cancel()
    history = [entry.message for entry in read_audit_log(repo, 10)]
    assert len(history) == 2 and "start b/0" in history[0]
    assert str(pygit2.Repository(str(repo)).references["refs/llmgw/applied"].target) == first

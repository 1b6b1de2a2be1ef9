"""Training jobs in the control plane (docs/training.md): the pure rule that queues a job until a node has room and
nothing else trains there (`llmgw.training.queueing.schedule`), and the rule in the control loop on trio's MockClock:
a job starts at once where it fits, reports progress, sends its adapter back in pieces kept in a real SQLite store,
and ends done; a second job waits for the node, then starts; a node that goes silent fails its job with the reason
once it is lost; a cancel tells the node. The agent's side is simulated here (its real one: test_training_real.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio
import trio.testing

from llmgw.control import ControlLoop
from llmgw.control.handling import Handlers, every_command
from llmgw.control.state import WatchState
from llmgw.control.training import (
    CancelTraining, KeepTrainingPiece, Report, StartTraining, training_cancel_requested, training_piece_received,
    training_reported, training_seen, training_submitted,
)
from llmgw.control.training_handlers import keep_piece, read_adapter
from llmgw.errors import UsageError
from llmgw.plan.types import NodeState
from llmgw.settings import load_directory
from llmgw.store import SqliteStore
from llmgw.training.jobs import HyperParameters, JobState, JobStatus, TrainingBook, TrainingJob, job_from_request
from llmgw.training.queueing import Cancel, NodeRoom, schedule
from llmgw.training.running import pieces, sha256_hex

from .conftest import write_seed
from .loop_world import control_state, report

GI = 1 << 30
PAIRS = '{"question": "Who keeps the lighthouse?", "answer": "Old Tom."}\n'


def job(job_id: str, memory: int = 2 * GI, **changes) -> TrainingJob:
    return TrainingJob(job_id, "tiny", "/weights/tiny-hf", (("q", "a"),), memory_bytes=memory,
                       hyper=HyperParameters(steps=3), **changes)


def book(*jobs: TrainingJob | JobStatus) -> TrainingBook:
    return TrainingBook(tuple(j if isinstance(j, JobStatus) else JobStatus(j) for j in jobs))


# -- the pure rule -------------------------------------------------------------------------------------------------

def test_a_job_starts_on_a_node_with_room_and_one_job_trains_per_node():
    rooms = [NodeRoom("n1", free_memory_bytes=1 * GI), NodeRoom("n2", free_memory_bytes=4 * GI)]
    following, starts, cancels = schedule(book(job("a"), job("b")), rooms, 100.0)
    assert [(s.status.job_id, s.node_id) for s in starts] == [("a", "n2")] and not cancels
    a, b = following.jobs
    assert (a.state, a.node_id, a.started_unix, a.steps) == (JobState.STARTING, "n2", 100.0, 3)
    assert b.state is JobState.QUEUED
    assert b.waiting == "waiting for room (n1: 1Gi free of the 2Gi needed; n2: job a trains there)"
    # nothing changed: the same book, nothing sent
    assert schedule(following, rooms, 101.0) == (following, (), ())


def test_node_and_node_class_choose_where_a_job_may_run():
    rooms = [NodeRoom("n1", frozenset({"h100-80g"}), 8 * GI), NodeRoom("n2", frozenset({"cpu"}), 8 * GI),
             NodeRoom("n3", frozenset(), 8 * GI, connected=False)]
    _, starts, _ = schedule(book(job("a", node_class="cpu"), job("b", node="n1"), job("c", node="n3"),
                                 job("d", node_class="l4")), rooms, 0.0)
    assert [(s.status.job_id, s.node_id) for s in starts] == [("a", "n2"), ("b", "n1")]
    following, _, _ = schedule(book(job("c", node="n3"), job("d", node_class="l4")), rooms, 0.0)
    assert [s.waiting for s in following.jobs] == ["waiting for room (n3: not connected)",
                                                   "waiting for a node of class l4 to connect"]


def test_a_node_that_goes_fails_its_job_and_frees_it_and_a_cancel_is_sent_to_the_node():
    running = JobStatus(job("a"), JobState.RUNNING, node_id="n1", step=1, steps=3)
    lost = NodeRoom("n1", free_memory_bytes=8 * GI, connected=False, gone="node n1 was lost (no heartbeat for 30 s)")
    following, starts, _ = schedule(book(running, job("b")), [lost, NodeRoom("n2", free_memory_bytes=8 * GI)], 5.0)
    a = following.get("a")
    assert (a.state, a.ended_unix) == (JobState.FAILED, 5.0)
    assert a.error == "node n1 was lost (no heartbeat for 30 s); the job's training there is lost (submit it again)"
    assert [(s.status.job_id, s.node_id) for s in starts] == [("b", "n2")]
    following, _, _ = schedule(book(running), [], 6.0)  # a node forgotten (`llmgw node remove`)
    assert following.get("a").error.startswith("node n1 left the fleet")

    cancelled = replace(running, cancel=True, error="cancelled by the operator")
    following, starts, cancels = schedule(book(cancelled, job("b")), [NodeRoom("n1", free_memory_bytes=8 * GI)], 7.0)
    assert cancels == (Cancel("a", "n1", "cancelled by the operator"),)
    assert following.get("a").state is JobState.CANCELLED
    assert [(s.status.job_id, s.node_id) for s in starts] == [("b", "n1")]  # the node is free again at once


def test_a_job_its_agent_no_longer_runs_fails_once_a_heartbeat_says_so(tmp_path: Path):
    settings = load_directory(write_seed(tmp_path / "seed", "ab" * 32))
    state = control_state(settings, NodeState("n1"), NodeState("n2"))
    jobs = [JobStatus(job("a"), JobState.RUNNING, node_id="n1"), JobStatus(job("b"), JobState.STARTING, node_id="n1"),
            JobStatus(job("c"), JobState.SENDING, node_id="n1"), JobStatus(job("d"), JobState.CONVERTING, node_id="n2")]
    state = replace(state, training=book(*jobs))
    assert training_seen(state, "n1", frozenset({"a"}), 1.0) is state
    after = training_seen(state, "n1", frozenset(), 2.0).training
    assert [s.state for s in after.jobs] == [JobState.FAILED, JobState.STARTING, JobState.SENDING, JobState.CONVERTING]
    assert after.get("a").error == "the agent of node n1 no longer runs the job (it restarted?); submit it again"


def test_a_job_request_is_checked_field_by_field():
    made = job_from_request({"model": "tiny", "base": "/w", "pairs": PAIRS + "\n" + PAIRS, "memory": "3Gi",
                             "hyper": {"rank": 4, "steps": "5", "targets": ["q_proj", "o_proj"]}}, "j1", 9.0)
    assert (made.memory_bytes, made.hyper.rank, made.hyper.steps, made.hyper.targets, len(made.pairs)) == (
        3 * GI, 4, 5, ("q_proj", "o_proj"), 2)
    assert made.hyper.learning_rate == HyperParameters().learning_rate  # defaults for the rest
    refused = {
        "a training job needs \"pairs\"": {"model": "tiny", "base": "/w"},
        "\"pairs\", line 2: not JSON": {"model": "tiny", "base": "/w", "pairs": PAIRS + "{oops\n"},
        "\"pairs\", line 1: give an object": {"model": "tiny", "base": "/w", "pairs": '{"question": "q"}\n'},
        "hyper-parameter rank is 0": {"model": "tiny", "base": "/w", "pairs": PAIRS, "hyper": {"rank": 0}},
        "unknown hyper-parameter 'epochs'": {"model": "tiny", "base": "/w", "pairs": PAIRS, "hyper": {"epochs": 2}},
        "targets names lm_head": {"model": "tiny", "base": "/w", "pairs": PAIRS, "hyper": {"targets": ["lm_head"]}},
        "not both": {"model": "tiny", "base": "/w", "pairs": PAIRS, "node": "n1", "node_class": "cpu"},
    }
    for said, body in refused.items():
        with pytest.raises(UsageError, match=said.replace("(", r"\(")):
            job_from_request(body, "j1", 0.0)


def test_the_adapter_is_kept_in_pieces_and_read_back_whole(tmp_path: Path):
    store = SqliteStore(tmp_path / "store.sqlite3")
    data = bytes(range(256)) * 5000  # 1.28 MB: three pieces
    parts = pieces(data)
    assert len(parts) == 3 and b"".join(parts) == data
    for index, part in enumerate(parts):
        keep_piece(store, KeepTrainingPiece("j1", "adapter.gguf", index, 3, part, len(data), sha256_hex(data)))
    doc, back = read_adapter(store, "j1")
    assert back == data and doc == {"name": "adapter.gguf", "size": len(data), "sha256": sha256_hex(data), "count": 3}
    store.put("training/j1/piece/1", "AAAA")  # damaged
    with pytest.raises(UsageError, match="does not match its sha256"):
        read_adapter(store, "j1")
    with pytest.raises(UsageError, match="no adapter of training job j2"):
        read_adapter(store, "j2")


# -- the rule in the control loop, on MockClock --------------------------------------------------------------------

@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


class Trainer:
    """A loop over node n1 (8 GiB, heard from every second while `beating`); training commands are recorded and
    answered ok, pieces kept in a real SQLite store."""

    def __init__(self, tmp_path: Path):
        settings = replace(load_directory(write_seed(tmp_path / "seed", "ab" * 32)), commit="a" * 40)
        self.store = SqliteStore(tmp_path / "store.sqlite3")
        self.sent: list = []
        self.beating = True
        handlers = Handlers(every_command(self.command))
        handlers.register(StartTraining, self.record)
        handlers.register(CancelTraining, self.record)
        handlers.register(KeepTrainingPiece, self.keep)
        state = control_state(settings, NodeState("n1", cpu_cores=4, memory_bytes=8 * GI))
        self.loop = ControlLoop(replace(state, watch=WatchState(settings=settings)), handlers, interval=lambda: 5.0)

    async def command(self, command) -> None:
        pass

    async def record(self, effect) -> None:
        self.sent.append((type(effect).__name__, effect.status.job_id if isinstance(effect, StartTraining)
                          else effect.job_id, effect.node_id, trio.current_time()))

    async def keep(self, effect: KeepTrainingPiece) -> None:
        from llmgw.control.training import training_piece_kept

        keep_piece(self.store, effect)
        self.loop.update(training_piece_kept(effect.job_id, effect.sha256, 0.0), "kept")

    async def beat(self) -> None:
        while True:
            if self.beating:
                self.loop.update(report("n1"), "heartbeat")
            await trio.sleep(1)

    def status(self, job_id: str) -> JobStatus:
        return self.loop.state.training.get(job_id)


async def until(check, limit: float = 300.0) -> None:
    with trio.fail_after(limit):
        while not check():
            await trio.sleep(0.5)


async def test_jobs_queue_for_the_node_run_send_their_adapter_and_a_lost_node_fails_its_job(tmp_path, autojump_clock):
    world = Trainer(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(world.loop.run)
        nursery.start_soon(world.beat)
        world.loop.update(training_submitted(job("a", 6 * GI), 1.0), "submitted")
        world.loop.update(training_submitted(job("b", 6 * GI), 1.0), "submitted")
        await until(lambda: world.sent)
        assert world.sent == [("StartTraining", "a", "n1", 0.0)]  # at once, not at the next pass
        assert world.status("b").waiting == "waiting for room (n1: job a trains there)"

        for step, loss in ((1, 3.5), (2, 2.25), (3, 1.5)):
            world.loop.update(training_reported("n1", Report("a", "running", step, 3, loss, (3.5, 2.25, 1.5)[:step],
                                                              900 << 20, step * 2.0), 2.0), "report")
        world.loop.update(training_reported("n2", Report("a", "failed", error="not mine"), 2.0), "report")
        await world.loop.folded_all()
        a = world.status("a")
        assert (a.state, a.step, a.loss, a.losses, a.peak_memory_bytes) == (
            JobState.RUNNING, 3, 1.5, (3.5, 2.25, 1.5), 900 << 20)

        data = b"GGUF" + bytes(700_000)
        world.loop.update(training_reported("n1", Report("a", "sending", 3, 3, 1.5, (3.5, 2.25, 1.5)), 3.0), "r")
        for index, part in enumerate(pieces(data)):
            world.loop.update(training_piece_received("n1", KeepTrainingPiece(
                "a", "adapter.gguf", index, 2, part, len(data), sha256_hex(data))), "piece")
        world.loop.update(training_reported("n1", Report("a", "done", 3, 3, 1.5, (3.5, 2.25, 1.5)), 3.0), "r")
        await until(lambda: world.status("a").state is JobState.DONE)
        assert read_adapter(world.store, "a")[1] == data
        # the node is free: b starts at the next pass (every 5 s)
        await until(lambda: len(world.sent) == 2)
        assert world.sent[1][:3] == ("StartTraining", "b", "n1") and world.sent[1][3] <= 10.0

        # n1 goes silent: once lost (30 s without a heartbeat), b fails naming it
        world.beating = False
        silent_at = trio.current_time()
        await until(lambda: world.status("b").state is JobState.FAILED)
        assert 29.0 <= trio.current_time() - silent_at <= 37.0  # the last beat came up to 1 s before
        assert world.status("b").error.startswith("node n1 was lost (no heartbeat for 30 s)")

        # a cancel of a job on a node is sent to the node
        world.beating = True
        await trio.sleep(2)
        world.loop.update(training_submitted(job("c"), 50.0), "submitted")
        await world.loop.folded_all()
        await until(lambda: world.status("c").state is JobState.STARTING)
        world.loop.update(training_cancel_requested("c", "cancelled by the operator", 51.0), "cancel")
        await until(lambda: world.sent[-1][0] == "CancelTraining")
        assert world.sent[-1][1:3] == ("c", "n1")
        assert (world.status("c").state, world.status("c").error) == (JobState.CANCELLED, "cancelled by the operator")
        nursery.cancel_scope.cancel()

"""Each kind of effect: the pure rule emits it for the state that calls for it, and its handler turns it into the
wire message or the write it stands for. The far side is real where it is cheap: an agent's end of a memory link
behind a real `AgentHub` (answering commands), a real git repository for the audit, a real SQLite store."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pygit2
import pytest
import trio
import trio.testing

from llmgw.agent.reporting import FEATURES
from llmgw.control.agents import AgentHub
from llmgw.control.audit import AuditWriter, status_document
from llmgw.control.deciding import decide
from llmgw.control.effects import (
    CommitSettings, ConfigureAgent, InstallEngine, NodeVerb, PublishRoutingTable, RecordSlurmUsage, RememberNodes, ServingStopped,
    SetApplied, StartShard, StopShard, WriteAudit,
)
from llmgw.control.events import change_effects, settings_edit_requested, slurm_jobs_reported
from llmgw.control.feeding import GatewayFeed
from llmgw.control.handlers import EffectContext, register_handlers
from llmgw.control.handling import Handlers
from llmgw.control.recovering import KNOWN_NODES_KEY, decode_known
from llmgw.control.slurm_store import read_cursor
from llmgw.control.slurm_usage import slurm_usage
from llmgw.control.state import Recovering, WatchState
from llmgw.plan import agent_settings_fingerprint, fingerprint
from llmgw.plan.types import NodeState
from llmgw.settings import APPLIED_REF, load_directory, read_audit_log
from llmgw.store import open_store
from llmgw.wire import agent_message, memory_link_pair, pb

from .conftest import write_seed
from .loop_world import World, control_state, shard


@pytest.fixture
def settings(tmp_path: Path):
    return load_directory(write_seed(tmp_path / "seed", "ab" * 32))


@pytest.fixture
def autojump_clock():
    return trio.testing.MockClock(autojump_threshold=0)


def node(*shards, engines=("llama.cpp@b11434",)) -> NodeState:
    return NodeState("n1", cpu_cores=4, memory_bytes=8 << 30, shards=shards, engines_installed=frozenset(engines))


def only(effects, kind):
    found = [e for e in effects if isinstance(e, kind)]
    assert len(found) == 1, effects
    return found[0]


class FarAgent:
    """Node n1's agent at the far end of a memory link to a real `AgentHub`: registers, then records every message
    and answers each command with `ok`."""

    def __init__(self, ok: bool = True):
        self.ok = ok
        self.received: list = []
        self.updates: list = []
        self.hub = AgentHub(lambda transition, reason=None, origin_unix=None: self.updates.append(reason))

    async def serve(self, nursery: trio.Nursery) -> None:
        agent_end, control_end = memory_link_pair()
        nursery.start_soon(self.hub.accept, control_end, "memory")
        nursery.start_soon(self._answer, agent_end)
        while "n1" not in self.hub.sessions:
            await trio.sleep(0.01)

    async def _answer(self, link) -> None:
        await link.send(agent_message(register=pb.Register(node_id="n1", agent_version="0.1.0", node_secret="n" * 43,
                                                           features=FEATURES)))
        async for message in link:
            self.received.append(message)
            if message.WhichOneof("body") in ("start_shard", "stop_shard", "install_engine", "agent_settings"):
                await link.send(agent_message(command_result=pb.CommandResult(
                    command_id=message.command_id, ok=self.ok, error="" if self.ok else "no room")))

    def bodies(self, kind: str) -> list:
        return [getattr(m, kind) for m in self.received if m.WhichOneof("body") == kind]


def context(far: FarAgent, tmp_path: Path, updates: list | None = None, store=None) -> tuple[Handlers, AuditWriter]:
    audit = AuditWriter(tmp_path / "settings.git")
    handlers = Handlers()

    def status(state):
        return status_document(state.watch, state.fleet.records(), state.last_pass, state.last_plan)

    register_handlers(handlers, EffectContext(
        agents=far.hub, secret=lambda name: "", replica_key=lambda rid: f"key-{rid}", audit=audit, status=status,
        update=lambda transition, reason=None: (updates if updates is not None else []).append(transition),
        store=store))
    return handlers, audit


async def run_effect(handlers: Handlers, effect) -> None:
    handler = handlers.get(effect)
    assert handler is not None, type(effect)
    await handler(effect)


async def test_a_replica_to_place_is_a_start_shard_sent_as_the_wire_s_start_shard(settings, tmp_path):
    decision, _ = decide(control_state(settings, node()), 0.0)
    start = only(decision.effects, StartShard)
    assert (start.action.replica_id, start.node_id, start.settings) == ("tiny-0", "n1", settings)
    far = FarAgent()
    handlers, _ = context(far, tmp_path)
    async with trio.open_nursery() as nursery:
        await far.serve(nursery)
        await run_effect(handlers, start)
        nursery.cancel_scope.cancel()
    [sent] = far.bodies("start_shard")
    assert (sent.shard_id, sent.model, sent.replica_key) == ("tiny-0/0", "tiny", "key-tiny-0")


async def test_a_shard_the_catalog_no_longer_has_is_a_stop_shard_and_a_refusal_raises(settings, tmp_path):
    old = shard("gone-0", "f" * 64, model="gone")
    decision, _ = decide(control_state(settings, node(old, shard("tiny-0", fingerprint(
        settings.models["tiny"], "b11434")))), 0.0)
    stop = only(decision.effects, StopShard)
    assert stop.action.shard_id == "gone-0/0"
    far = FarAgent(ok=False)
    handlers, _ = context(far, tmp_path)
    async with trio.open_nursery() as nursery:
        await far.serve(nursery)
        with pytest.raises(Exception, match="refused to stop gone-0/0: no room"):
            await run_effect(handlers, stop)
        nursery.cancel_scope.cancel()
    assert [s.shard_id for s in far.bodies("stop_shard")] == ["gone-0/0"]


async def test_an_engine_the_node_lacks_is_an_install_engine_for_its_platform(settings, tmp_path):
    state = control_state(settings, node(engines=()))
    fleet, _ = state.fleet.register(node(engines=()), 0.0, os="Linux 6.8.0", arch="amd64", agent_version="0.1.0",
                                    features=FEATURES)
    decision, _ = decide(state.with_fleet(fleet), 0.0)
    install = only(decision.effects, InstallEngine)
    assert (install.action.engine, install.platform) == ("llama.cpp@b11434", "linux-x86_64")
    far = FarAgent()
    handlers, _ = context(far, tmp_path)
    async with trio.open_nursery() as nursery:
        await far.serve(nursery)
        await run_effect(handlers, install)
        nursery.cancel_scope.cancel()
    [sent] = far.bodies("install_engine")
    assert (sent.engine, sent.version) == ("llama.cpp", "b11434")


async def test_agent_settings_not_acknowledged_are_a_configure_agent_carrying_its_own_fingerprint(settings, tmp_path):
    decision, _ = decide(control_state(settings, node(), acked=False), 0.0)
    configure = only(decision.effects, ConfigureAgent)
    wanted = agent_settings_fingerprint(settings, "n1")
    assert (configure.node_id, configure.fingerprint) == ("n1", wanted)
    assert configure.action.engine == ""  # the fingerprint is no engine
    far = FarAgent()
    handlers, _ = context(far, tmp_path)
    async with trio.open_nursery() as nursery:
        await far.serve(nursery)
        await run_effect(handlers, configure)
        nursery.cancel_scope.cancel()
    [sent] = far.bodies("agent_settings")
    assert sent.fingerprint == wanted and sent.heartbeat_interval > 0


async def test_a_leader_s_pass_is_a_write_audit_and_a_converged_one_a_set_applied(settings, tmp_path):
    ready = shard("tiny-0", fingerprint(settings.models["tiny"], "b11434"))
    repo = tmp_path / "settings.git"
    bare = pygit2.init_repository(str(repo), bare=True)
    tree = bare.TreeBuilder().write()
    signature = pygit2.Signature("t", "t@example.com")
    commit = str(bare.create_commit("refs/heads/main", signature, signature, "settings", tree, []))
    state = control_state(replace(settings, commit=commit), node(ready))  # a commit the ref can point at
    decision, after = decide(state, 0.0)
    audit_effect, applied = only(decision.effects, WriteAudit), only(decision.effects, SetApplied)
    assert audit_effect.state is after and applied.commit == commit and decision.record.converged
    follower, _ = decide(replace(state, leadership=replace(state.leadership, leader=False)), 0.0)
    assert not [e for e in follower.effects if isinstance(e, (WriteAudit, SetApplied))]
    updates: list = []
    far = FarAgent()
    handlers, audit = context(far, tmp_path, updates)
    async with trio.open_nursery() as nursery:
        await nursery.start(audit.run)
        await run_effect(handlers, audit_effect)
        await run_effect(handlers, applied)
        assert await audit.flush(60)
        nursery.cancel_scope.cancel()
    [entry] = read_audit_log(repo)
    assert entry.message.startswith(f"pass 1 for settings {commit[:12]}: tiny-0 ready on n1")
    assert "Converged: yes" in entry.message
    assert str(bare.references[APPLIED_REF].target) == commit
    [written] = updates  # the snapshot written goes back into the state: the same status is no second commit
    again = replace(after, audit_snapshot=written(after)[0].audit_snapshot)
    unchanged = WriteAudit(audit_effect.record, again, 0)
    await run_effect(handlers, unchanged)
    assert audit.pending() == 0 and len(updates) == 1


async def test_connected_nodes_once_recovered_are_remembered_in_the_store(settings, tmp_path):
    state = control_state(settings, node())
    decision, after = decide(state, 0.0)
    remember = only(decision.effects, RememberNodes)
    assert remember.nodes == frozenset({"n1"}) and after.remembered == frozenset({"n1"})
    assert not [e for e in decide(after, 1.0)[0].effects if isinstance(e, RememberNodes)]  # unchanged: not again
    waiting = replace(state, recovering=Recovering(frozenset({"n1", "n2"}), 0.0, 60.0))
    assert not [e for e in decide(waiting, 1.0)[0].effects if isinstance(e, RememberNodes)]  # n2 not back yet
    store = open_store(tmp_path / "llmgw.sqlite3")
    handlers, _ = context(FarAgent(), tmp_path, store=store)
    await run_effect(handlers, remember)
    assert decode_known(store.get(KNOWN_NODES_KEY)) == frozenset({"n1"})
    store.close()


async def test_ended_slurm_jobs_are_recorded_once_and_the_agent_told_the_cursor_moved(settings, tmp_path):
    state = control_state(settings, node())
    job = pb.SlurmJob(job_id="77", partition="gpu", account="research", state="completed", elapsed_seconds=3600,
                      cpus=2, end_time=1_700_000_000.0)
    jobs = (slurm_usage(job, "lab", "n1", {}),)
    after, relevant, effects = slurm_jobs_reported(state, "n1", "lab", jobs, 1_700_000_100.0)
    record = only(effects, RecordSlurmUsage)
    assert not relevant and record.jobs == jobs and record.until == 1_700_000_100.0
    assert slurm_jobs_reported(after, "n1", "lab", jobs, 1_700_000_100.0)[2] == ()  # reported again: nothing new
    store = open_store(tmp_path / "llmgw.sqlite3")
    updates: list = []
    far = FarAgent()
    handlers, _ = context(far, tmp_path, updates, store=store)
    async with trio.open_nursery() as nursery:
        await far.serve(nursery)
        await run_effect(handlers, record)
        while not far.bodies("slurm_jobs_recorded"):
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert store.usage_of_request("slurm:lab:77").project == "research"
    assert read_cursor(store, "lab") == 1_700_000_100.0
    assert far.bodies("slurm_jobs_recorded")[0].until == 1_700_000_100.0
    [written] = updates
    assert written(after)[0].slurm.cursors["lab"] == 1_700_000_100.0
    store.close()


async def test_a_settings_change_publishes_the_routing_table_at_once_to_the_gateway(settings, autojump_clock):
    class Gateway:
        tables: list = []

        def set_table(self, table) -> None:
            self.tables.append(table)

        def set_blocks(self, snapshot) -> None:
            pass

    old = control_state(settings, node(shard("tiny-0", fingerprint(settings.models["tiny"], "b11434"))))
    old = replace(old, watch=WatchState())
    new = replace(old, watch=WatchState(settings=settings))
    publish = only(change_effects(old, new, []), PublishRoutingTable)
    assert publish.at_once and publish.state is new
    assert change_effects(new, replace(new, passes=3), []) == ()  # nothing the table reads changed
    feed = GatewayFeed(lambda rid: f"key-{rid}", lambda name: None)
    gateway = Gateway()
    feed.attach(gateway)
    await feed.publish(publish)
    route = gateway.tables[-1].resolve("tiny")
    assert route is not None and feed.rebuilds == 1
    assert [r.replica_id for r in route.replicas] == ["tiny-0"]


async def test_the_applied_ref_moves_after_the_audit_commit_queued_before_it(settings, autojump_clock):
    handled: list[str] = []

    async def slow_audit(effect) -> None:
        await trio.sleep(1.0)  # a handler that waits does not let a later effect of its lane overtake it
        handled.append(f"audit {effect.record.number}")

    async def applied(effect) -> None:
        handled.append(f"applied {effect.commit[:4]}")

    handlers = Handlers()
    handlers.register(WriteAudit, slow_audit, lane="audit")
    handlers.register(SetApplied, applied, lane="audit")
    ready = shard("tiny-0", fingerprint(settings.models["tiny"], "b11434"))
    world = World(control_state(replace(settings, commit="c" * 40), node(ready)))
    world.loop.handlers = handlers
    async with trio.open_nursery() as nursery:
        await nursery.start(world.loop.run)
        world.loop.run_pass("test")
        world.loop.run_pass("test")
        await trio.sleep(5.0)
        nursery.cancel_scope.cancel()
    assert handled == ["audit 1", "applied cccc", "audit 2", "applied cccc"]


async def test_effects_handled_waits_for_the_effects_of_a_pass_that_wait_pass_saw_end(settings, autojump_clock):
    handled: list[str] = []

    async def slow_audit(effect) -> None:
        await trio.sleep(3.0)  # e.g. an audit lane behind a slow store write
        handled.append(f"audit {effect.record.number}")

    handlers = Handlers()
    handlers.register(WriteAudit, slow_audit, lane="audit")
    ready = shard("tiny-0", fingerprint(settings.models["tiny"], "b11434"))
    world = World(control_state(replace(settings, commit="c" * 40), node(ready)))
    world.loop.handlers = handlers
    async with trio.open_nursery() as nursery:
        await nursery.start(world.loop.run)
        await world.loop.effects_handled()  # nothing dispatched yet: returns at once
        world.loop.kick("test")
        record = await world.loop.wait_pass()
        assert handled == []  # the pass ended; its audit effect is still being handled
        await world.loop.effects_handled()
        assert handled == [f"audit {record.number}"] and trio.current_time() >= 3.0
        nursery.cancel_scope.cancel()


async def test_a_person_s_edit_is_a_commit_settings_committed_as_them_and_answered(settings, tmp_path):
    """The edit is an event whose effect the desk's handler commits (real git, authored by the person); the watcher
    reads the new head, and the requester gets the commit id, or the writer's error with nothing committed."""
    from llmgw.control.operating import SettingsDesk
    from llmgw.control.watching import SettingsWatcher
    from llmgw.errors import SettingsError
    from llmgw.settings import branch_head, init_repository, load_commit

    repo = tmp_path / "settings.git"
    init_repository(repo, write_seed(tmp_path / "seed", "ab" * 32))
    state = control_state(settings, node())
    edit = CommitSettings("r1", ServingStopped(True), "Ada", "ada@example.com")
    after, relevant, effects = settings_edit_requested(edit)(state)
    assert after is state and not relevant and effects == (edit,)
    news: list = []
    watcher = SettingsWatcher(str(repo), "main", tmp_path / "mirror.git", publish=news.append)
    handlers = Handlers()
    desk = SettingsDesk(watcher, str(repo), "main", lambda transition, reason=None: [
        nursery.start_soon(run_effect, handlers, e) for e in transition(state)[2]])
    handlers.register(CommitSettings, desk.commit, lane="settings")
    async with trio.open_nursery() as nursery:
        commit = (await desk.edit(ServingStopped(True), "Ada", "ada@example.com")).commit
        assert commit == branch_head(str(repo), "main")
        assert news[-1].settings.commit == commit and news[-1].settings.cluster.serving_stopped  # the watcher's
        author = pygit2.Repository(str(repo))[commit].author
        assert (author.name, author.email) == ("Ada", "ada@example.com")
        with pytest.raises(SettingsError, match="slurm.yaml"):  # the writer's error reaches the requester
            await desk.edit(NodeVerb("lend", "n1"), "Ada", "ada@example.com")  # the seed has no slurm.yaml
        assert branch_head(str(repo), "main") == commit
        cordoned = await desk.edit(NodeVerb("cordon", "n1"), "Ada", "ada@example.com")
        assert cordoned.changed and cordoned.commit == news[-1].settings.commit
        assert news[-1].settings.cluster.cordoned == ("n1",)
        nursery.cancel_scope.cancel()
    assert load_commit(str(repo), commit).cluster.serving_stopped


def test_effects_without_a_handler_are_dropped_and_a_kind_has_one_handler():
    handlers = Handlers()
    assert handlers.get(SetApplied("c" * 40)) is None
    handlers.register(SetApplied, lambda effect: None)
    with pytest.raises(ValueError, match="SetApplied"):
        handlers.register(SetApplied, lambda effect: None)

"""A node's reports change only its own (issue 25, item 4), driven through the control plane's message handlers
(`llmgw.control.agents.MESSAGES`) as a node's stream delivers them:

- ended Slurm jobs are billed only from the node slurm.yaml names controller, for its cluster, with times and
  counts in bounds; before, any node's heartbeat wrote usage rows for any account at any cost, and
  `finished_until=1e10` moved the sacct cursor so that real jobs were never billed;
- prefix-cache blocks only for replicas the sending node's shards run, at most `limits.kv_blocks_per_replica`
  hashes per replica; a full update replaces that replica only.
"""

from __future__ import annotations

import time
from dataclasses import replace

from llmgw.control.agents import MESSAGES, AgentHub
from llmgw.control.effects import RecordSlurmUsage
from llmgw.control.sessions import AgentSession
from llmgw.control.state import ControlState, WatchState, frozen
from llmgw.settings.model import ClusterSettings, Settings
from llmgw.settings.slurm import SlurmSettings
from llmgw.wire import pb

SETTINGS = Settings(cluster=ClusterSettings(name="lab"),
                    slurm=SlurmSettings(enabled=True, cluster_name="lab", controller="ctl", accounting=True))


def slurm_beat(until: float, *jobs: pb.SlurmJob, cluster: str = "lab") -> pb.Heartbeat:
    return pb.Heartbeat(slurm=pb.SlurmReport(cluster_name=cluster, finished_jobs=list(jobs), finished_until=until))


def job(job_id: str, end: float, **fields) -> pb.SlurmJob:
    values = {"partition": "batch", "account": "demo", "user": "bob", "state": "completed", "elapsed_seconds": 3600,
              "gpus": 8, "end_time": end, **fields}
    return pb.SlurmJob(job_id=job_id, **values)


def deliver_slurm(node_id: str, beat: pb.Heartbeat, state: ControlState):
    """The state and effects after `node_id`'s heartbeat `beat` (its ended-jobs transition), and what was logged."""
    updates, refused = [], []
    hub = AgentHub(lambda transition, reason=None, origin_unix=None: updates.append(transition))
    hub.refused = lambda node, sentence: refused.append(sentence)
    MESSAGES["heartbeat"](hub, node_id, AgentSession(None, node_id, "memory"), beat, 0.0)
    assert len(updates) == 1, "the ended jobs are one transition of their own"
    state, _changed, *effects = updates[0](state)
    return state, tuple(effects[0]) if effects else (), refused


def cursor_state(cursor: float = 0.0) -> ControlState:
    state = ControlState(watch=WatchState(settings=SETTINGS))
    if cursor:
        state = replace(state, slurm=replace(state.slurm, cursors=frozen({"lab": cursor})))
    return state


def test_a_forged_slurm_report_from_a_node_that_is_not_the_controller_changes_nothing():
    now = time.time()
    forged = slurm_beat(1e10, job("9001", now - 60, account="victim", gpus=4096, elapsed_seconds=86400))
    before = cursor_state(now - 600)
    state, effects, refused = deliver_slurm("n2", forged, before)
    assert effects == () and state.slurm == before.slurm  # no usage row asked for, the cursor where it was
    assert refused and "'n2' sent ended Slurm jobs but is not the Slurm controller (ctl" in refused[0]
    honest = slurm_beat(now, job("9001", now - 60))
    state, effects, refused = deliver_slurm("ctl", honest, before)
    assert not refused and [type(e) for e in effects] == [RecordSlurmUsage]
    assert [rid for rid, _ in effects[0].jobs] == ["slurm:lab:9001"] and state.slurm.cursors["lab"] == now


def test_the_controllers_report_is_bounded_in_time_cluster_and_count():
    now = time.time()
    before = cursor_state(now - 3600)
    cases = {
        "finished_until far in the future": slurm_beat(1e10, job("1", now - 60)),
        "finished_until not a number": slurm_beat(float("nan"), job("1", now - 60)),
        "a job ending in the future": slurm_beat(now, job("1", now + 86400)),
        "a job ending long before the cursor": slurm_beat(now, job("1", now - 30 * 86400)),
        "another cluster": slurm_beat(now, job("1", now - 60), cluster="other"),
        "a job a century long": slurm_beat(now, job("1", now - 60, elapsed_seconds=100 * 365 * 86400)),
        "too many GPUs": slurm_beat(now, job("1", now - 60, gpus=1 << 31)),
        "too many jobs": slurm_beat(now, *[job(str(n), now - 60) for n in range(2001)]),
    }
    for name, beat in cases.items():
        state, effects, refused = deliver_slurm("ctl", beat, before)
        assert effects == () and state.slurm == before.slurm and refused, name
    within_skew = slurm_beat(now + 60, job("1", now + 30))  # the node's clock a minute ahead
    state, effects, refused = deliver_slurm("ctl", within_skew, before)
    assert not refused and effects and state.slurm.cursors["lab"] == now + 60
    behind = slurm_beat(now - 7200, job("2", now - 3700))  # before the cursor: recorded, the cursor stays
    state, effects, refused = deliver_slurm("ctl", behind, before)
    assert not refused and effects and state.slurm.cursors["lab"] == now - 3600


def blocks(replica_id: str, stored=(), *, full=True, removed=()) -> pb.KvBlocks:
    return pb.KvBlocks(shard_id=f"{replica_id}/0", replica_id=replica_id, full=full, stored=list(stored),
                       removed=list(removed), block_size=16, hash_algorithm="sha256_cbor", hash_seed="0")


def shard(replica_id: str, *, foreign: bool = False) -> pb.ShardStatus:
    return pb.ShardStatus(shard_id=f"{replica_id}/0", replica_id=replica_id, model="m", state="ready",
                          foreign=foreign)


def hub_with(cap: int = 1_000_000, **runs: list[pb.ShardStatus]) -> tuple[AgentHub, dict[str, AgentSession]]:
    """A hub whose nodes (keyword: node id) reported `runs` as their shards in a heartbeat."""
    hub = AgentHub(lambda transition, reason=None, origin_unix=None: None, kv_cap=lambda: cap)
    sessions = {}
    for node_id, shards in runs.items():
        sessions[node_id] = AgentSession(None, node_id, "memory")
        MESSAGES["heartbeat"](hub, node_id, sessions[node_id], pb.Heartbeat(shard_states=shards), 0.0)
    return hub, sessions


def test_a_kv_block_update_for_another_nodes_replica_is_refused():
    hub, sessions = hub_with(n1=[shard("r1")], n2=[shard("r2"), shard("r9", foreign=True)])
    MESSAGES["kv_blocks"](hub, "n1", sessions["n1"], blocks("r1", [1, 2, 3]), 0.0)
    before = hub.blocks
    assert set(before.replicas["r1"].blocks) == {1, 2, 3}
    MESSAGES["kv_blocks"](hub, "n2", sessions["n2"], blocks("r1", [666]), 0.0)  # a full copy: would replace r1's
    MESSAGES["kv_blocks"](hub, "n2", sessions["n2"], blocks("r1", full=False, removed=[1, 2, 3]), 0.0)
    MESSAGES["kv_blocks"](hub, "n2", sessions["n2"], blocks("r9", [7]), 0.0)  # an engine llmgw did not start
    assert hub.blocks is before and before.replicas["r1"].node_id == "n1"
    MESSAGES["kv_blocks"](hub, "n2", sessions["n2"], pb.KvBlocks(replica_id="r1", full=True), 0.0)  # nor remove it
    assert hub.blocks is before
    MESSAGES["shard_status"](hub, "n2", sessions["n2"], shard("r3"), 0.0)  # a shard starting: its blocks are its own
    MESSAGES["kv_blocks"](hub, "n2", sessions["n2"], blocks("r3", [5]), 0.0)
    assert set(hub.blocks.replicas["r3"].blocks) == {5}
    MESSAGES["heartbeat"](hub, "n2", sessions["n2"], pb.Heartbeat(shard_states=[shard("r2")]), 0.0)  # r3 stopped
    MESSAGES["kv_blocks"](hub, "n2", sessions["n2"], blocks("r3", [6]), 0.0)  # no longer its own to add to
    assert set(hub.blocks.replicas["r3"].blocks) == {5}
    MESSAGES["kv_blocks"](hub, "n2", sessions["n2"], pb.KvBlocks(replica_id="r3", full=True), 0.0)  # but to remove
    assert "r3" not in hub.blocks.replicas and "r1" in hub.blocks.replicas


def test_a_full_update_replaces_only_its_replica():
    hub, sessions = hub_with(n1=[shard("r1"), shard("r3")], n2=[shard("r2")])
    for node, replica, stored in (("n1", "r1", [1, 2]), ("n1", "r3", [3]), ("n2", "r2", [4])):
        MESSAGES["kv_blocks"](hub, node, sessions[node], blocks(replica, stored), 0.0)
    MESSAGES["kv_blocks"](hub, "n1", sessions["n1"], blocks("r1", [9]), 0.0)
    assert {r: set(b.blocks) for r, b in hub.blocks.replicas.items()} == {"r1": {9}, "r3": {3}, "r2": {4}}


def test_over_the_cap_a_replicas_map_is_dropped_until_a_full_update_within_it():
    hub, sessions = hub_with(cap=10, n1=[shard("r1"), shard("r2")])
    deliver = MESSAGES["kv_blocks"]
    deliver(hub, "n1", sessions["n1"], blocks("r2", [100]), 0.0)
    deliver(hub, "n1", sessions["n1"], blocks("r1", range(11)), 0.0)
    assert "r1" not in hub.blocks.replicas and "r2" in hub.blocks.replicas
    deliver(hub, "n1", sessions["n1"], blocks("r1", range(10)), 0.0)
    assert len(hub.blocks.replicas["r1"].blocks) == 10
    deliver(hub, "n1", sessions["n1"], blocks("r1", [10], full=False, removed=[0]), 0.0)  # still 10
    assert len(hub.blocks.replicas["r1"].blocks) == 10
    deliver(hub, "n1", sessions["n1"], blocks("r1", [11], full=False), 0.0)  # 11: over
    assert "r1" not in hub.blocks.replicas and set(hub.blocks.replicas["r2"].blocks) == {100}

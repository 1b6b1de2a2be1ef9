"""What the control plane keeps of Slurm in its store survives its restart (a real ControlPlane on a SQLite store, an
agent speaking the real protocol over the in-process link, scripted here so the test needs no Slurm):

- the sacct cursor: ended jobs a heartbeat carries are recorded into usage once, the cursor (the report's
  `finished_until`) is written to the store and sent back to the agent (SlurmJobsRecorded); a second control plane on
  the same store tells the controller's agent to read from there (`SlurmRole.finished_since`), so the jobs are
  neither read again nor missed;
- the Linux users of `users: llmgw`: the members' logins and UIDs the first plane gave are the ones the second sends.
"""

from __future__ import annotations

import secrets
import time

import trio

from llmgw.agent.slurm import CURSOR_MARGIN
from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.slurm_store import read_cursor
from llmgw.settings import init_repository
from llmgw.errors import StoreError
from llmgw.store import SqliteStore, open_store
from llmgw.wire import agent_message, pb

from .conftest import write_seed

SLURM_YAML = """\
enabled: true
cluster_name: lab
controller: n1
nodes:
  n1: {partition: batch}
partitions:
  batch: {default: true}
accounting: true
users: llmgw
shared_path: /srv/shared
"""
MEMBERS = ("ada.lovelace@lab.example", "bob@lab.example")


def job(job_id: str, end: float) -> pb.SlurmJob:
    return pb.SlurmJob(job_id=job_id, partition="batch", account="demo", user="bob", state="completed",
                       elapsed_seconds=60, cpus=2, end_time=end)


class ScriptedAgent:
    """Node n1's agent as the protocol sees it: registers, acknowledges its agent settings (kept in `settings`),
    heartbeats every 0.1 s with `report`, and keeps the SlurmJobsRecorded it is sent; like the real agent, it then
    reads on from there, so the jobs that ended before it (less the margin) are in no later beat."""

    def __init__(self) -> None:
        self.settings: list[pb.AgentSettings] = []
        self.recorded: list[float] = []
        self.report = pb.SlurmReport(cluster_name="lab")

    async def run(self, connect, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with connect() as link:
            await link.send(agent_message(register=pb.Register(node_id="n1", address="127.0.0.1", os="linux", node_secret="n" * 43,
                                                               arch="x86_64", cpu_cores=4,
                                                               memory_total_bytes=8 << 30)))
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._beat, link)
                async for message in link:
                    kind = message.WhichOneof("body")
                    if kind == "agent_settings":
                        self.settings.append(message.agent_settings)
                    elif kind == "slurm_jobs_recorded":
                        until = message.slurm_jobs_recorded.until
                        self.recorded.append(until)
                        kept = [j for j in self.report.finished_jobs if j.end_time > until - CURSOR_MARGIN]
                        self.report = pb.SlurmReport(cluster_name="lab", finished_jobs=kept,
                                                     finished_until=self.report.finished_until)
                    if message.command_id:
                        await link.send(agent_message(command_result=pb.CommandResult(
                            command_id=message.command_id, ok=kind == "agent_settings", error="scripted")))

    async def _beat(self, link) -> None:
        while True:
            await link.send(agent_message(heartbeat=pb.Heartbeat(time=time.time(), slurm=self.report)))
            await trio.sleep(0.1)


async def wait_until(check, what: str, seconds: float = 20.0) -> None:
    with trio.fail_after(seconds):
        while not check():
            await trio.sleep(0.05)
    assert check(), what


def slurm_repo(tmp_path, sha: str):
    """A settings repository with Slurm on node n1 (controller, accounting, users: llmgw) and MEMBERS in project
    demo, and the munge key in the control plane's secrets (`<tmp_path>/state/secrets`)."""
    seed = write_seed(tmp_path / "seed", sha, replicas=0)
    (seed / "agents" / "nodes").mkdir()
    (seed / "agents" / "nodes" / "n1.yaml").write_text("{}\n")
    (seed / "slurm.yaml").write_text(SLURM_YAML)
    projects = seed / "projects.yaml"
    projects.write_text(projects.read_text().replace("          demo:\n",
                                                     f"          demo:\n            members: [{', '.join(MEMBERS)}]\n"))
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    (tmp_path / "state" / "secrets").mkdir(parents=True)
    (tmp_path / "state" / "secrets" / "munge-key").write_text(secrets.token_urlsafe(48))
    return repo


async def test_the_sacct_cursor_and_the_users_uids_outlive_the_control_plane(tmp_path, weights_mirror) -> None:
    repo = slurm_repo(tmp_path, weights_mirror[1])
    now = time.time()

    async def run_plane(agent: ScriptedAgent, until: float, jobs: list[pb.SlurmJob]) -> None:
        plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state"))
        async with trio.open_nursery() as nursery:
            await nursery.start(plane.run)
            await nursery.start(agent.run, plane.local_connector())
            await wait_until(lambda: agent.settings, "the agent got its settings")
            agent.report = pb.SlurmReport(cluster_name="lab", finished_jobs=jobs, finished_until=until)
            await wait_until(lambda: until in agent.recorded, "the agent was told the jobs are recorded")
            nursery.cancel_scope.cancel()

    first = ScriptedAgent()
    await run_plane(first, now - 60, [job("1", now - 600), job("2", now - 120)])
    role = first.settings[0].slurm
    assert role.finished_since == 0.0  # no cursor yet: the agent reads the last hour
    assert [(u.login, u.uid) for u in role.users] == [("ada-lovelace", 200000), ("bob", 200001)]
    assert role.shared_path == "/srv/shared" and role.users[0].home == "/srv/shared/home/ada-lovelace"

    second = ScriptedAgent()  # the control plane restarted: its agent connects again
    await run_plane(second, now, [job("2", now - 120), job("3", now - 30)])  # job 2 is in the agent's margin
    role = second.settings[0].slurm
    assert role.finished_since == now - 60  # the cursor the first plane stored: read on from there
    assert [(u.login, u.uid) for u in role.users] == [("ada-lovelace", 200000), ("bob", 200001)]

    store = open_store(tmp_path / "state" / "llmgw.sqlite3")
    try:
        assert read_cursor(store, "lab") == now
        rows = [r for r in store.recent_usage() if r.model == "slurm/batch"]
        assert sorted(r.replica for r in rows) == ["slurm:1", "slurm:2", "slurm:3"]  # each job once
    finally:
        store.close()


class StoreFailingOnce(SqliteStore):
    """The SQLite store, refusing the first Slurm job it is asked to record (a database away for a moment)."""

    failed: list[str] = []

    def record_usage_once(self, record, request_id):
        if not self.failed:
            self.failed.append(request_id)
            raise StoreError("the store is away for a moment")
        return super().record_usage_once(record, request_id)


async def test_a_job_whose_recording_failed_keeps_the_cursor_until_it_is_recorded(tmp_path, weights_mirror) -> None:
    repo = slurm_repo(tmp_path, weights_mirror[1])
    store = StoreFailingOnce(tmp_path / "state" / "llmgw.sqlite3")
    now = time.time()
    agent = ScriptedAgent()
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", store=store))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        await nursery.start(agent.run, plane.local_connector())
        await wait_until(lambda: agent.settings, "the agent got its settings")
        agent.report = pb.SlurmReport(cluster_name="lab", finished_jobs=[job("1", now - 900)], finished_until=now)
        await wait_until(lambda: now in agent.recorded, "the job recorded from a later beat, then acknowledged")
        assert store.failed == ["slurm:lab:1"]  # the first try failed: no acknowledgement came of it
        assert [r.replica for r in store.recent_usage()] == ["slurm:1"] and read_cursor(store, "lab") == now
        nursery.cancel_scope.cancel()
    store.close()

"""The agent's Slurm keeper without Slurm: a daemon that keeps crashing is started again after a backoff that
doubles (on trio's MockClock, real processes), a node without Slurm reports a warning in Slurm's absence instead of
crashing, and the agent keeps its settings on disk without the munge key or the database password.

The keeper with real Slurm daemons is tests/slurm/test_agent_slurm.py."""

from __future__ import annotations

import time

import trio
import trio.testing
from trio.testing import MockClock

from llmgw.agent.config import load_agent_settings, save_agent_settings
from llmgw.agent.slurm import Daemon, SlurmKeeper, SlurmLayout, keep_running, without_secrets
from llmgw.wire import pb


async def _starts(clock: MockClock, daemon: Daemon, log_file, seconds: float, **options) -> list[float]:
    """The mock times at which `daemon` was running, over `seconds` of mock time. The clock moves on (0.25 s at a
    time) only while the daemon waits out a backoff: its process starts, runs and exits in real time meanwhile the
    clock stands still, however loaded the machine (an autojump clock would jump past a process that is slow to
    exit; the wall clock took the 20 s)."""
    starts: list[float] = []

    def changed(d: Daemon) -> None:
        if d.state == "running":
            starts.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: keep_running(daemon, log_file, on_change=changed, **options))
        end = trio.current_time() + seconds
        while trio.current_time() < end:
            await trio.testing.wait_all_tasks_blocked()
            if daemon.state == "backoff":  # asleep until its next start: nothing else to wait for
                clock.jump(0.25)
            else:  # starting (Popen runs in a thread) or running: real time passes, mock time does not
                await trio.to_thread.run_sync(time.sleep, 0.005)
        nursery.cancel_scope.cancel()
    return starts


async def test_a_daemon_that_keeps_crashing_is_restarted_after_a_doubling_backoff(tmp_path, mock_clock) -> None:
    daemon = Daemon("slurmd", ("sh", "-c", "echo 'fatal: Unable to bind listen port (6818)'; exit 3"))
    starts = await _starts(mock_clock, daemon, tmp_path / "slurmd.out", 20)
    assert [round(b - a) for a, b in zip(starts, starts[1:])] == [1, 2, 4, 8]  # each backoff doubles
    assert daemon.restarts == 5
    assert daemon.error.startswith("slurmd exited with status 3: ")
    assert "Unable to bind listen port (6818)" in daemon.error  # in the daemon's own words
    assert daemon.state == "backoff" and daemon.pid == 0


async def test_a_daemon_that_ran_long_enough_starts_again_after_one_second(tmp_path, mock_clock) -> None:
    daemon = Daemon("slurmctld", ("sh", "-c", "exit 1"))
    starts = await _starts(mock_clock, daemon, tmp_path / "out", 4.5, stable_after=0)  # every run counts as a long one
    assert [round(b - a) for a, b in zip(starts, starts[1:])] == [1, 1, 1, 1]


async def test_a_node_without_slurm_reports_a_warning_and_starts_nothing(tmp_path) -> None:
    async with trio.open_nursery() as nursery:
        keeper = SlurmKeeper(SlurmLayout(tmp_path / "slurm"), nursery,
                             programs={name: str(tmp_path / "missing" / name) for name in ("munged", "slurmd")})
        await keeper.apply(pb.SlurmRole(daemons=["slurmd"], node_name="n1", munge_key=b"k" * 32))
        report = keeper.report()
        assert report is not None and not report.daemons
        assert [w.split(" is ")[0] for w in report.warnings] == ["munged", "slurmd"]
        assert "is not installed on this node" in report.warnings[0]
        await keeper.apply(pb.SlurmRole())  # told it has no part: nothing left to say
        assert keeper.report() is None
        nursery.cancel_scope.cancel()


def test_the_kept_agent_settings_hold_no_slurm_secret(tmp_path) -> None:
    key = b"munge-key-" + bytes(range(40))
    settings = pb.AgentSettings(heartbeat_interval=2, slurm=pb.SlurmRole(
        daemons=["slurmdbd", "slurmctld"], munge_key=key, storage_password="s3cret-pass",
        slurmdbd_conf="StoragePass=s3cret-pass\n", slurm_conf="ClusterName=x\n"))
    path = save_agent_settings(tmp_path, without_secrets(settings))
    data = path.read_bytes()
    assert key not in data and b"s3cret-pass" not in data
    kept = load_agent_settings(tmp_path)
    assert kept is not None and list(kept.slurm.daemons) == ["slurmdbd", "slurmctld"]
    assert kept.slurm.slurm_conf == "ClusterName=x\n" and settings.slurm.munge_key == key  # the original is intact


SACCT_OUT = """JobID|JobName|Partition|Account|User|State|ElapsedRaw|AllocCPUS|AllocTRES|Start|End
7|wrap|gpu|ci|alice|COMPLETED|60|2|billing=2,cpu=2,node=1|1799999900|1799999960
7.batch|batch||ci||COMPLETED|60|2|cpu=2,node=1|1799999900|1799999960
5|wrap|gpu|ci|alice|FAILED|10|1|billing=1,cpu=1,node=1|1799999000|1799999010
8|srun||ci|alice|COMPLETED|0|1||1799999970|1799999980
"""


async def test_the_controller_reads_ended_jobs_from_the_cursor_and_moves_it_when_told(tmp_path) -> None:
    import time as clock

    calls = tmp_path / "sacct-calls"
    sacct = tmp_path / "sacct"
    (tmp_path / "out.txt").write_text(SACCT_OUT)
    sacct.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\ncat {tmp_path / 'out.txt'}\n")
    sacct.chmod(0o755)
    now = 1_800_000_000.0

    def window() -> list[str]:
        args = calls.read_text().splitlines()[-1].split()
        return [args[args.index("-S") + 1], args[args.index("-E") + 1]]

    def local(seconds: float) -> str:
        return clock.strftime("%Y-%m-%dT%H:%M:%S", clock.localtime(seconds))

    async with trio.open_nursery() as nursery:
        keeper = SlurmKeeper(SlurmLayout(tmp_path / "slurm"), nursery, programs={"sacct": str(sacct)})
        keeper.daemons["slurmdbd"] = Daemon("slurmdbd", ("slurmdbd",))  # the controller with accounting
        await keeper.read_finished_jobs(now)
        assert window() == [local(now - 3600), local(now)]  # no cursor yet: the last hour
        # oldest first; job 8 has no partition yet (slurmdbd has not completed it): left for a later read, and the
        # cursor stops before its end so that read still covers it
        assert [j.job_id for j in keeper.finished_jobs] == ["5", "7"]
        assert keeper.finished_until == 1799999980 - 1
        assert keeper.report().finished_until == keeper.finished_until

        keeper.recorded(1799999979)  # the control plane recorded them and stored its cursor
        await keeper.read_finished_jobs(now + 10)
        assert window() == [local(1799999979 - 300), local(now + 10)]  # from the cursor, less the margin
        keeper.recorded(1000.0)  # an older acknowledgement never moves it back
        assert keeper.finished_since == 1799999979

        await keeper.apply(pb.SlurmRole(daemons=["slurmctld"], finished_since=1799990000))
        assert keeper.finished_since == 1799990000  # a new control plane's CONFIGURE says where its store stands
        nursery.cancel_scope.cancel()


async def test_the_shared_path_and_containers_say_what_is_missing_and_the_mount_reports_mounts_words(tmp_path) -> None:
    mount = tmp_path / "mount"  # a stand-in: this machine's kernel has no NFS client (docs/slurm.md)
    mount.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'argv'}\necho 'mount: unknown filesystem type' >&2\nexit 32\n")
    mount.chmod(0o755)
    shared = tmp_path / "shared"
    async with trio.open_nursery() as nursery:
        keeper = SlurmKeeper(SlurmLayout(tmp_path / "slurm"), nursery, programs={
            "runc": str(tmp_path / "missing" / "runc"), "ganesha.nfsd": str(tmp_path / "missing" / "ganesha.nfsd"),
            "mount": str(mount)})
        exporting = await keeper.keep_shared_path(pb.SlurmRole(containers="runc", shared_path=str(shared),
                                                                nfs_clients=["10.0.0.2"]))
        assert [w.split(" is not installed")[0] for w in exporting] == ["runc", "nfs-ganesha"], exporting
        assert "ganesha.conf" in {p.name for p in (tmp_path / "slurm" / "nfs").iterdir()} and not keeper.daemons
        [mounting] = await keeper.keep_shared_path(pb.SlurmRole(shared_path=str(shared), nfs_server="10.0.0.1"))
        assert mounting == f"mounting 10.0.0.1:{shared} at {shared} failed: mount: unknown filesystem type"
        assert (tmp_path / "argv").read_text().split() == [
            "-t", "nfs4", "-o", "vers=4.1,proto=tcp,port=2049,hard", f"10.0.0.1:{shared}", str(shared)]
        nursery.cancel_scope.cancel()

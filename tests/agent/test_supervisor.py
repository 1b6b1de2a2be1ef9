"""The supervisor against real processes: process groups, readiness, restarts with backoff, stop, adoption."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
import trio

from llmgw.agent import procfs
from llmgw.agent.shards import ShardRecord, record_path, save_record
from llmgw.agent.supervisor import Supervisor

from agent_support import standin_spec, wait_for


def _alive(pid: int) -> bool:
    return procfs.process_start_time(pid) is not None


def _gone(pid: int) -> bool:
    """True when `pid` has ended (a zombie that its new parent has not reaped yet counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


async def test_engine_runs_in_its_own_process_group_and_becomes_ready(tmp_path):
    async with Supervisor(tmp_path) as supervisor:
        spec = standin_spec("m-0/0", supervisor.free_port())
        view = await supervisor.start(spec)
        assert view.state == "starting" and view.pid > 0
        await wait_for(lambda: supervisor.get("m-0/0").state == "ready")
        pid = view.pid
        assert os.getpgid(pid) == pid and os.getsid(pid) == pid != os.getsid(0)
        # the port, the thread count and the log ring
        import httpx
        async with httpx.AsyncClient() as client:
            body = (await client.get(f"http://127.0.0.1:{spec.port}/v1/models")).json()
        assert body["threads"] == "2"
        await wait_for(lambda: any("listening on" in line for line in supervisor.logs("m-0/0")))
        # the record on disk names the process by pid and start time, readable by the owner only
        path = record_path(tmp_path, "m-0/0")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert f'"pid": {pid}' in path.read_text()
        assert f'"start_time": {procfs.process_start_time(pid)}' in path.read_text()
        await supervisor.stop("m-0/0")
        assert not _alive(pid) and not path.exists() and supervisor.shards() == []


async def test_unexpected_exit_is_reported_with_last_log_lines_and_restarted_with_doubling_backoff(tmp_path):
    seen = []
    async with Supervisor(tmp_path, on_change=seen.append, backoff_initial=0.2, backoff_max=0.4) as supervisor:
        spec = standin_spec("m-0/0", supervisor.free_port(), STANDIN_EXIT_AFTER="0.6")
        first = await supervisor.start(spec)
        await wait_for(lambda: supervisor.get("m-0/0").restarts >= 3, timeout=20)
        failures = [v for v in seen if v.state == "failed"]
        assert failures[0].error == "the engine exited with status 3; restarting in 0.2 s"
        assert failures[1].error.endswith("restarting in 0.4 s")
        assert failures[2].error.endswith("restarting in 0.4 s")  # capped at backoff_max
        assert any("giving up now" in line for line in failures[0].last_log_lines)
        pids = {v.pid for v in seen if v.state == "starting"}
        assert first.pid in pids and len(pids) >= 3  # a new process each time
        await supervisor.stop("m-0/0", grace=1)


async def test_stop_sends_sigkill_to_a_group_that_ignores_sigterm_after_the_grace_period(tmp_path):
    async with Supervisor(tmp_path) as supervisor:
        spec = standin_spec("m-0/0", supervisor.free_port(), STANDIN_IGNORE_TERM="1")
        view = await supervisor.start(spec)
        await wait_for(lambda: supervisor.get("m-0/0").state == "ready")
        began = time.monotonic()
        final = await supervisor.stop("m-0/0", grace=0.7)
        assert time.monotonic() - began >= 0.7
        assert final.state == "stopped" and not _alive(view.pid)


async def test_a_restarted_supervisor_adopts_the_running_engine_instead_of_restarting_it(tmp_path):
    async with Supervisor(tmp_path) as first:
        spec = standin_spec("m-0/0", first.free_port())
        view = await first.start(spec)
        await wait_for(lambda: first.get("m-0/0").state == "ready")
    assert _alive(view.pid)  # leaving the supervisor leaves engines running
    async with Supervisor(tmp_path) as second:
        adopted = await second.adopt()
        assert [(v.shard_id, v.pid, v.adopted) for v in adopted] == [("m-0/0", view.pid, True)]
        await wait_for(lambda: second.get("m-0/0").state == "ready")
        assert any("listening on" in line for line in await wait_for(lambda: second.logs("m-0/0")))
        # an adopted engine that dies is restarted like any other
        os.killpg(view.pid, signal.SIGKILL)
        await wait_for(lambda: second.get("m-0/0").pid not in (0, view.pid), timeout=20)
        await wait_for(lambda: second.get("m-0/0").state == "ready")
        assert second.get("m-0/0").restarts == 1
        await second.stop("m-0/0")


async def test_a_recorded_pid_now_used_by_another_process_is_neither_adopted_nor_killed(tmp_path):
    other = subprocess.Popen(["sleep", "60"])
    try:
        spec = standin_spec("m-0/0", 0)
        async with Supervisor(tmp_path) as supervisor:
            spec = standin_spec("m-0/0", supervisor.free_port())
            real_start = procfs.process_start_time(other.pid)
            save_record(tmp_path, ShardRecord(spec, other.pid, real_start - 1))
            views = await supervisor.adopt()
            assert views[0].adopted is False and views[0].pid not in (0, other.pid)
            await wait_for(lambda: supervisor.get("m-0/0").state == "ready")
            await supervisor.stop("m-0/0")
        assert other.poll() is None  # the stranger is still running
    finally:
        other.kill()
        other.wait()


async def test_an_engine_llmgw_did_not_start_is_reported_and_left_running(tmp_path):
    fake = tmp_path / "llama-server"
    fake.symlink_to("/bin/sleep")
    # its own process group, as an engine someone else started has: engines are reported one per process group,
    # and this test's own group holds whatever engines the session's fixtures run (one of them was reported instead)
    stranger = subprocess.Popen([str(fake), "60"], start_new_session=True)
    try:
        async with Supervisor(tmp_path) as supervisor:
            spec = standin_spec("m-0/0", supervisor.free_port())
            await supervisor.start(spec)
            foreign = await wait_for(lambda: [f for f in supervisor.foreign_engines() if f.pid == stranger.pid])
            assert foreign[0].argv == (str(fake), "60")
            assert supervisor.get("m-0/0").pid not in {f.pid for f in supervisor.foreign_engines()}
            await supervisor.stop("m-0/0")
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


async def test_an_engine_binary_that_cannot_run_is_an_engine_error(tmp_path):
    from llmgw.errors import EngineError

    async with Supervisor(tmp_path) as supervisor:
        spec = standin_spec("m-0/0", supervisor.free_port())
        with pytest.raises(EngineError, match="cannot start the engine of shard m-0/0"):
            await supervisor.start(type(spec)(**{**spec.__dict__, "argv": (str(tmp_path / "missing"),)}))
        assert supervisor.shards() == [] and not record_path(tmp_path, "m-0/0").exists()


async def test_a_headless_rank_that_serves_no_http_is_ready_while_it_runs_and_failed_when_it_exits(tmp_path):
    from llmgw.agent.shards import ShardSpec

    async with Supervisor(tmp_path, backoff_initial=5.0) as supervisor:
        spec = ShardSpec("m-0/1", ("sh", "-c", "sleep 1"), supervisor.free_port(), health_path="", rank=1,
                         group="m-0/0")
        await supervisor.start(spec)
        await wait_for(lambda: supervisor.get("m-0/1").state == "ready")
        await wait_for(lambda: supervisor.get("m-0/1").state == "failed", timeout=10)
        await supervisor.stop("m-0/1")


async def test_a_drained_stop_reports_stopping_first_and_a_second_stop_waits_for_the_drain(tmp_path):
    seen = []
    async with Supervisor(tmp_path, on_change=seen.append, ready_check_interval=0.05) as supervisor:
        spec = standin_spec("m-0/0", supervisor.free_port())
        pid = (await supervisor.start(spec)).pid
        await wait_for(lambda: supervisor.get("m-0/0").state == "ready")
        drained = trio.Event()
        release = trio.Event()

        async def drain(spec_drained) -> None:  # the engine's requests finishing (llmgw.agent.draining)
            assert spec_drained is spec and _alive(pid)
            drained.set()
            await release.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(supervisor.stop, "m-0/0", None, drain)
            await drained.wait()
            await trio.sleep(0.3)  # several health checks pass meanwhile: the shard stays STOPPING
            assert supervisor.get("m-0/0").state == "stopping" and _alive(pid)
            nursery.start_soon(supervisor.stop, "m-0/0")  # sent again: waits for the drain, kills nothing
            await trio.sleep(0.2)
            assert _alive(pid)
            release.set()
        assert not _alive(pid) and supervisor.shards() == []
        states = [v.state for v in seen if v.shard_id == "m-0/0"]
        assert states[-2:] == ["stopping", "stopped"] and "ready" not in states[states.index("stopping"):]


async def test_an_engine_killed_has_the_rest_of_its_process_group_killed_before_it_is_started_again(tmp_path):
    """vLLM's API server runs its EngineCore as a child: when the server is killed, the supervisor kills what is left
    of its group before starting it again, so no orphan keeps the memory and KV-event connection of the dead one."""
    from llmgw.agent.shards import ShardSpec

    children = tmp_path / "children"
    script = f"sleep 300 & echo $! >> {children}; wait"  # the engine's own child, in its process group
    async with Supervisor(tmp_path / "state", backoff_initial=0.2) as supervisor:
        spec = ShardSpec("m-0/0", ("sh", "-c", script), supervisor.free_port(), health_path="")
        first = await supervisor.start(spec)
        await wait_for(lambda: children.is_file() and children.read_text().strip())
        child = int(children.read_text().split()[0])
        assert os.getpgid(child) == first.pid
        os.kill(first.pid, signal.SIGKILL)
        await wait_for(lambda: len(children.read_text().split()) == 2, timeout=10)  # started again
        assert _gone(child)
        await wait_for(lambda: supervisor.get("m-0/0").pid not in (0, first.pid), timeout=10)  # recorded after spawn
        await supervisor.stop("m-0/0", grace=1)

"""The console on a real `llmgw server`: the CLI mounts it on the admin listener (`ControlConfig.admin_mounts`,
llmgw.cli.console_mount), since the control plane imports no console; a control plane started without the mount
serves the admin API and no console."""

from __future__ import annotations

import httpx
import trio

from control.conftest import write_seed
from control.process_fleet import spawn_server
from control.test_fleet_end_to_end import wait_for
from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import init_repository
from support.llmgw_processes import LlmgwProcesses


def test_llmgw_server_serves_the_console_with_its_login_and_sampler(tmp_path):
    repo, state = tmp_path / "settings.git", tmp_path / "state"
    init_repository(repo, write_seed(tmp_path / "seed", "ab" * 32))
    procs = LlmgwProcesses(tmp_path)
    try:
        _server, admin = spawn_server(procs, repo, state)
        wait_for(lambda: admin.get("/api/v1/health").json()["leader"], 60, "the server to lead")
        login = admin.get("/console/login", headers={"Authorization": ""})
        assert login.status_code == 200 and 'name="csrf"' in login.text
        assert admin.get("/console/nodes", headers={"Authorization": ""}).status_code == 401
        cluster = admin.get("/console/")  # the admin token as a bearer token
        assert cluster.status_code == 200 and "Content-Security-Policy" in cluster.headers
        assert admin.get("/api/v1/health").status_code == 200  # the admin API beside it
    finally:
        procs.stop()


async def test_a_control_plane_without_the_mount_serves_no_console(tmp_path, settings_repo):
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", gateway=False))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        async with httpx.AsyncClient(base_url=plane.admin_url,
                                     headers={"Authorization": f"Bearer {plane.admin_token}"}) as client:
            assert (await client.get("/console/")).status_code == 404
            assert (await client.get("/api/v1/health")).status_code == 200
        nursery.cancel_scope.cancel()

"""The console's LOW items of issue 26: a query parameter that is not a number in range is a 400 naming it (it was a
500 with a traceback), and a session logged in with a store token ends within a minute of that token's revocation
(it lived its 8 hours), checked against a real store through the CLI's console mount."""

from __future__ import annotations

import pytest
import trio

from llmgw.cli.console_mount import console_mount
from llmgw.console import Console, Login
from llmgw.console.sessions import RECHECK_SECONDS
from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.admin import AdminApp

from .test_console_security import HTML, TOKEN, Wall, admin_only, log_in, no_history, state_with_one_gpu_node


async def no_usage(by: str, since: float | None) -> list:
    await trio.lowlevel.checkpoint()
    return []


async def no_logs(node: str, shard: str, lines: int) -> list[str]:
    await trio.lowlevel.checkpoint()
    return []


@pytest.mark.parametrize("path,name", [
    ("/console/nodes/gpu1/logs?lines=abc", "lines"), ("/console/nodes/gpu1/logs?lines=0", "lines"),
    ("/console/history?limit=abc", "limit"), ("/console/history?limit=-3", "limit"),
    ("/console/usage?days=1e9", "days"), ("/console/usage?days=9999", "days"),
])
async def test_a_bad_query_parameter_is_a_400_naming_it(path, name):
    state = state_with_one_gpu_node()
    console = Console(lambda: state, authorise=admin_only, history=no_history, usage=no_usage, logs=no_logs)
    answer = await console.app.test_client().get(path, headers={"Authorization": f"Bearer {TOKEN}"})
    text = await answer.get_data(as_text=True)
    assert answer.status_code == 400 and f"the query parameter {name!r}" in text and "Traceback" not in text


async def test_a_session_ends_within_a_minute_of_its_token_being_revoked():
    revoked: set[str] = set()
    asked: list[str] = []

    async def login(token: str) -> Login | None:
        return Login("ci", "tok_1") if token == TOKEN else None

    async def still_valid(token_id: str) -> bool:
        asked.append(token_id)
        return token_id not in revoked

    state, wall = state_with_one_gpu_node(), Wall()
    console = Console(lambda: state, authorise=login, still_valid=still_valid, history=no_history, wall=wall)
    client = console.app.test_client()
    await log_in(client)
    assert (await client.get("/console/", headers=HTML)).status_code == 200 and asked == []  # just checked
    revoked.add("tok_1")
    wall.now += RECHECK_SECONDS - 1
    assert (await client.get("/console/", headers=HTML)).status_code == 200  # not due yet
    wall.now += 1
    assert (await client.get("/console/")).status_code == 401 and asked == ["tok_1"]
    assert RECHECK_SECONDS <= 60


async def test_a_revoked_store_token_logs_its_console_session_out(tmp_path, settings_repo):
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", gateway=False))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        record, token = plane.store.create_token("console", name="alice")
        _metrics, review = plane.store.create_token("metrics")[1], plane.store.create_token("review")[1]
        console: Console = console_mount(AdminApp(plane)).app  # the console as `llmgw server` mounts it
        wall = Wall()
        console.wall = wall
        client = console.app.test_client()
        assert (await log_in(client, review)).status_code == 401  # a token of another scope
        assert (await log_in(client, token)).status_code == 303
        assert (await client.get("/console/nodes", headers=HTML)).status_code == 200
        session = next(iter(console.sessions._sessions.values()))
        assert session.token_id == record.token_id and session.principal == "alice"
        plane.store.revoke_token(record.token_id)
        wall.now += RECHECK_SECONDS
        assert (await client.get("/console/nodes")).status_code == 401
        nursery.cancel_scope.cancel()

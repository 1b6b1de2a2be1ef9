"""The console's security, over HTTP with quart-trio's test client: no page without a session or bearer token,
CSRF on every form, cookies HttpOnly + SameSite=Strict (+ Secure over TLS), sessions expire, a CSP without
inline script on every answer, logout. The state is a real `ControlState` with a real `FleetRegistry`."""

from __future__ import annotations

import re

import pytest
import trio

from llmgw.console import Console, Login
from llmgw.console.app import CSP
from llmgw.control.readings import GpuSample, NodeReadings
from llmgw.control.registry import FleetRegistry
from llmgw.control.state import ControlState
from llmgw.plan.types import GpuState, NodeState

TOKEN = "admin-token-for-tests"


async def admin_only(token: str) -> Login | None:
    """The console's token check of these tests: TOKEN logs in as admin."""
    return Login("admin") if token == TOKEN else None

GIB = 1 << 30
PAGES = ("/console/", "/console/nodes", "/console/nodes/gpu1", "/console/gpus", "/console/replicas",
         "/console/history")
HTML = {"Accept": "text/html"}


class Wall:
    """Unix seconds the console sees, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def state_with_one_gpu_node() -> ControlState:
    registry = FleetRegistry(lost_after=30.0)
    registry, _ = registry.register(NodeState("gpu1", gpus=(GpuState("0", "h200-141g", 141 * GIB, 141 * GIB),),
                                              cpu_cores=16.0, memory_bytes=64 * GIB), 0.0)
    readings = NodeReadings(at=0.0, cpu_percent=25.0, memory_used_bytes=16 * GIB, memory_available_bytes=48 * GIB,
                            gpus=(GpuSample(0, utilization_percent=85.0, memory_used_bytes=50 * GIB,
                                             power_draw_watts=300.0, power_limit_watts=700.0),))
    registry, _ = registry.heartbeat("gpu1", 0.0, readings=readings)
    return ControlState(fleet=registry)


async def no_history(limit: int) -> list:
    await trio.lowlevel.checkpoint()
    return []


@pytest.fixture
def wall() -> Wall:
    return Wall()


@pytest.fixture
def console(wall) -> Console:
    state = state_with_one_gpu_node()
    return Console(lambda: state, authorise=admin_only, history=no_history,
                   clock=lambda: 1.0, wall=wall, session_ttl=3600.0)


async def log_in(client, token: str = TOKEN):
    page = await client.get("/console/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', await page.get_data(as_text=True)).group(1)
    return await client.post("/console/login", form={"csrf": csrf, "token": token})


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


@pytest.mark.parametrize("path", PAGES)
async def test_every_page_without_a_session_redirects_a_browser_to_the_login_form(console, path):
    response = await console.app.test_client().get(path, headers=HTML)
    assert response.status_code == 302 and response.headers["Location"] == "/console/login"


@pytest.mark.parametrize("path", PAGES)
async def test_every_page_without_a_session_is_401_to_a_program(console, path):
    response = await console.app.test_client().get(path)
    assert response.status_code == 401


async def test_a_wrong_bearer_token_is_refused_and_the_admin_token_is_let_in(console):
    client = console.app.test_client()
    assert (await client.get("/console/nodes", headers={"Authorization": "Bearer nope"})).status_code == 401
    response = await client.get("/console/nodes", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200 and "gpu1" in await response.get_data(as_text=True)


async def test_logging_in_sets_an_httponly_samesite_strict_cookie_and_opens_every_page(console):
    client = console.app.test_client()
    response = await log_in(client)
    assert response.status_code == 303 and response.headers["Location"] == "/console/"
    (cookie,) = [c for c in response.headers.getlist("Set-Cookie") if c.startswith("llmgw_console=")]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/console" in cookie
    assert "Secure" not in cookie  # plain HTTP
    assert TOKEN not in cookie and TOKEN not in response.headers["Location"]
    for path in PAGES:
        assert (await client.get(path, headers=HTML)).status_code == 200, path


async def test_over_tls_the_session_cookie_is_secure(console):
    client = console.app.test_client()
    page = await client.get("/console/login", scheme="https")
    response = await client.post("/console/login", form={"csrf": csrf_of(await page.get_data(as_text=True)),
                                                         "token": TOKEN}, scheme="https")
    (cookie,) = [c for c in response.headers.getlist("Set-Cookie") if c.startswith("llmgw_console=")]
    assert "Secure" in cookie


async def test_a_wrong_token_at_login_is_401_with_a_sentence_and_no_cookie(console):
    response = await log_in(console.app.test_client(), "guess")
    assert response.status_code == 401
    assert "not valid" in await response.get_data(as_text=True)
    assert not [c for c in response.headers.getlist("Set-Cookie") if c.startswith("llmgw_console=")]


async def test_a_login_with_a_bad_csrf_token_is_403(console):
    client = console.app.test_client()
    await client.get("/console/login")
    response = await client.post("/console/login", form={"csrf": "forged", "token": TOKEN})
    assert response.status_code == 403


async def test_logout_with_a_bad_csrf_token_is_403_and_the_session_stays(console):
    client = console.app.test_client()
    await log_in(client)
    assert (await client.post("/console/logout", form={"csrf": "forged"})).status_code == 403
    assert (await client.get("/console/nodes", headers=HTML)).status_code == 200


async def test_after_logout_every_page_is_refused(console):
    client = console.app.test_client()
    await log_in(client)
    page = await client.get("/console/", headers=HTML)
    response = await client.post("/console/logout", form={"csrf": csrf_of(await page.get_data(as_text=True))})
    assert response.status_code == 303 and response.headers["Location"] == "/console/login"
    for path in PAGES:
        assert (await client.get(path)).status_code == 401, path


async def test_a_session_expires(console, wall):
    client = console.app.test_client()
    await log_in(client)
    wall.now += 3599.0
    assert (await client.get("/console/", headers=HTML)).status_code == 200
    wall.now += 2.0
    assert (await client.get("/console/")).status_code == 401


async def test_a_second_login_keeps_the_first_session_and_logging_out_one_keeps_the_other(console, wall):
    """Two operators (two browsers) log in one after the other: both stay logged in; each expires on its own."""
    first, second = console.app.test_client(), console.app.test_client()
    await log_in(first)
    wall.now += 600.0
    await log_in(second)
    for client in (first, second):
        assert (await client.get("/console/nodes", headers=HTML)).status_code == 200
    page = await second.get("/console/", headers=HTML)
    await second.post("/console/logout", form={"csrf": csrf_of(await page.get_data(as_text=True))})
    assert (await second.get("/console/")).status_code == 401
    assert (await first.get("/console/nodes", headers=HTML)).status_code == 200
    await log_in(second)
    wall.now += 3000.0  # the first session is 3,600 s old: gone; the second 3,000 s: still open
    assert (await first.get("/console/")).status_code == 401
    assert (await second.get("/console/", headers=HTML)).status_code == 200


@pytest.mark.parametrize("path", ("/console/login", *PAGES))
async def test_every_answer_has_a_csp_without_inline_script_and_no_page_has_any(console, path):
    client = console.app.test_client()
    await log_in(client)
    response = await client.get(path, headers=HTML)
    assert response.headers["Content-Security-Policy"] == CSP
    assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP
    html = await response.get_data(as_text=True)
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", html) == []  # no inline <script>
    assert " style=" not in html and " on" + "click=" not in html


async def test_the_nodes_page_shows_bars_coloured_by_load(console):
    client = console.app.test_client()
    await log_in(client)
    html = await (await client.get("/console/nodes", headers=HTML)).get_data(as_text=True)
    assert re.search(r'<td class="cpu"><meter class="load-low"[^>]*value="0.250"', html)
    assert re.search(r'<td class="ram"><meter class="load-low"[^>]*value="0.250"', html)
    assert re.search(r'<td class="gpu"><meter class="load-high"[^>]*value="0.850"', html)


async def test_an_unknown_node_is_404_with_a_sentence(console):
    client = console.app.test_client()
    await log_in(client)
    response = await client.get("/console/nodes/nowhere", headers=HTML)
    assert response.status_code == 404 and "no node nowhere" in await response.get_data(as_text=True)


@pytest.mark.parametrize(("by", "colour", "value"), [
    ("utilization", "load-high", "85 %"),     # 85 % busy
    ("memory", "load-low", "35 %"),           # 50 of 141 GiB
    ("power", "load-mid", "43 %"),            # 300 of 700 W
])
async def test_the_gpu_map_is_coloured_by_utilisation_memory_or_power(console, by, colour, value):
    client = console.app.test_client()
    await log_in(client)
    html = await (await client.get(f"/console/gpus?by={by}", headers=HTML)).get_data(as_text=True)
    tile = re.search(r'<a class="tile ([^"]+)" id="tile-gpu1-0".*?<span class="value">([^<]+)</span>', html, re.S)
    assert tile.group(1) == colour and tile.group(2) == value
    assert f'id="by-{by}" aria-current="true"' in html


async def test_a_standby_control_planes_console_says_it_is_a_standby_and_shows_the_same_fleet(console):
    client = console.app.test_client()
    await log_in(client)
    html = await (await client.get("/console/nodes", headers=HTML)).get_data(as_text=True)
    assert '<span class="role standby" id="role">standby</span>' in html  # leadership.leader is False here
    assert 'id="node-gpu1"' in html


async def test_the_node_page_shows_the_firewall_table_it_holds_and_why_the_last_one_is_not_applied():
    state = state_with_one_gpu_node()
    fleet, _ = state.fleet.heartbeat("gpu1", 0.0, firewall={"digest": "d46e424c69fb4267", "rolled_back": "",
                                                             "error": "nft refused the table: syntax error"})
    console = Console(lambda: state.with_fleet(fleet), authorise=admin_only, history=no_history, clock=lambda: 1.0,
                      wall=Wall(), session_ttl=3600.0)
    client = console.app.test_client()
    await log_in(client)
    html = await (await client.get("/console/nodes/gpu1", headers=HTML)).get_data(as_text=True)
    assert re.search(r'<dd id="firewall">table inet llmgw <code>d46e424c69fb4267</code> '
                     r'<span class="error">nft refused the table: syntax error</span></dd>', html), html

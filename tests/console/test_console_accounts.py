"""Logging in to the console as a person (issue 36): an account's e-mail and password beside the token login,
five failed logins locking the e-mail and the address out (on trio's MockClock, autojump), a project member sent to
their projects' usage and refused the cluster's pages, and a session that ends when the person loses their role."""

from __future__ import annotations

import trio

from llmgw.console import Console, Login
from llmgw.console.sessions import RECHECK_SECONDS
from llmgw.console.throttle import LOCKOUT_SECONDS, MAX_FAILURES

from .test_console_security import HTML, Wall, admin_only, csrf_of, no_history, state_with_one_gpu_node

PASSWORD = "correct horse battery"


class Accounts:
    """Two people: ops (operator) and ada (member of demo); `roles` can be changed by the test."""

    def __init__(self) -> None:
        self.roles = {"ops@lab.example": ("operator", ()), "ada@lab.example": ("member", ("demo",))}

    async def log_in(self, email: str, password: str) -> Login | None:
        await trio.sleep(0.05)  # a scrypt's time
        if password != PASSWORD or email not in self.roles:
            return None
        role, projects = self.roles[email]
        return Login(email.split("@")[0], None, email, role, projects)

    async def recheck(self, login: Login) -> Login | None:
        await trio.lowlevel.checkpoint()
        role = self.roles.get(login.person or "")
        return None if role is None else Login(login.principal, None, login.person, role[0], role[1])

    async def person(self, email: str) -> Login | None:
        await trio.lowlevel.checkpoint()
        role, projects = self.roles.get(email, ("", ()))
        return Login(email.split("@")[0], None, email, role, projects)


async def usage_of(by: str, since: float | None, projects: tuple[str, ...] | None = None) -> list:
    await trio.lowlevel.checkpoint()
    return []


def console_with_accounts(wall: Wall | None = None) -> tuple[Console, Accounts]:
    accounts = Accounts()
    state = state_with_one_gpu_node()
    console = Console(lambda: state, authorise=admin_only, history=no_history, usage=usage_of, accounts=accounts,
                      **({"wall": wall} if wall else {}))
    return console, accounts


async def password_login(client, email: str, password: str):
    page = await client.get("/console/login")
    return await client.post("/console/login", form={"csrf": csrf_of(await page.get_data(as_text=True)),
                                                     "email": email, "password": password})


async def test_five_failed_logins_lock_the_account_out_even_with_the_right_password(autojump_clock):
    console, _ = console_with_accounts()
    client = console.app.test_client()
    page = await (await client.get("/console/login")).get_data(as_text=True)
    assert 'name="email"' in page and 'name="token"' in page  # both logins offered
    for _ in range(MAX_FAILURES):
        wrong = await password_login(client, "ops@lab.example", "not the password")
        assert wrong.status_code == 401
        assert "do not match an active account" in await wrong.get_data(as_text=True)
    locked = await password_login(client, "ops@lab.example", PASSWORD)
    text = await locked.get_data(as_text=True)
    assert locked.status_code == 429 and "Too many failed logins" in text and "15 minutes" in text
    await trio.sleep(LOCKOUT_SECONDS - 1)
    assert (await password_login(client, "ops@lab.example", PASSWORD)).status_code == 429
    await trio.sleep(1)
    opened = await password_login(client, "ops@lab.example", PASSWORD)
    assert opened.status_code == 303
    cluster = await client.get("/console/", headers=HTML)
    assert cluster.status_code == 200 and 'id="person"' in await cluster.get_data(as_text=True)


async def test_a_member_sees_their_usage_only_and_loses_the_session_with_their_role(autojump_clock):
    wall = Wall()
    console, accounts = console_with_accounts(wall)
    client = console.app.test_client()
    assert (await password_login(client, "ada@lab.example", PASSWORD)).status_code == 303
    landing = await client.get("/console/", headers=HTML)
    assert landing.status_code == 303 and landing.headers["Location"] == "/console/usage"
    usage = await client.get("/console/usage", headers=HTML)
    html = await usage.get_data(as_text=True)
    assert usage.status_code == 200 and "member of demo" in html and 'id="nav-nodes"' not in html
    nodes = await client.get("/console/nodes", headers=HTML)
    assert nodes.status_code == 403
    assert "ada@lab.example is a member of demo: members see their projects' usage" in await nodes.get_data(as_text=True)
    del accounts.roles["ada@lab.example"]  # taken out of projects.yaml (or the account disabled)
    wall.now += RECHECK_SECONDS
    assert (await client.get("/console/usage")).status_code == 401

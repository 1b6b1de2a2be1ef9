"""A project's quotas in the console (issue 36: a member sees "their projects' keys, usage and quotas"), over HTTP on
loopback against a real control plane, its settings and its store: the limits are projects.yaml's (the project's,
its team's, its organisation's), what counts against each is what the gateway's quota check reads from the store
(requests reserved the way the gateway reserves them, `Store.reserve` over `Settings.quota_scopes`), and what the page
says is left is what that check then admits: one token more than is left is refused by the limit the page shows. A
member sees their own projects only; a viewer every project."""

from __future__ import annotations

import re
from contextlib import aclosing

import trio

from control.test_people_on_the_admin_api import PASSWORD, PEOPLE, people_repo
from llmgw.cli.console_mount import console_mount
from llmgw.control import ControlConfig, ControlPlane
from llmgw.store import Rejection, Reservation

from .test_console_actions import logged_in, text_of

PROJECTS = PEOPLE + """organisations:
  acme:
    quota:
      budget: 100.0
    teams:
      platform:
        quota:
          tokens_per_day: 50000
          concurrent_requests: 8
        projects:
          demo:
            models: [tiny]
            members: [ada@lab.example]
            quota:
              requests_per_minute: 5
              tokens_per_minute: 1000
          other:
            models: [tiny]
            quota:
              requests_per_minute: 60
"""


def rows(page: str, project: str) -> dict[str, tuple[float, float]]:
    """(used, limit) of each limit row of `project`'s section, by "<scope key>-<limit name>"."""
    return {key: (float(used), float(limit)) for key, used, limit in re.findall(
        rf'<tr id="quota-{project}-([^"]+)" data-used="([^"]+)" data-limit="([^"]+)"', page)}


async def test_a_member_sees_their_projects_quotas_and_what_the_gateway_counts_against_them(tmp_path, weights_mirror):
    repo = people_repo(tmp_path, weights_mirror[1], files={"projects.yaml": PROJECTS})
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", gateway=False,
                                       admin_mounts=(console_mount,)))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        settings = plane.snapshot().settings
        assert sorted(settings.projects) == ["demo", "other"]
        for email, name in (("ada@lab.example", "Ada Lovelace"), ("audit@lab.example", "Aud Itor")):
            plane.store.add_account(email, name, PASSWORD)
        demo, other = settings.quota_scopes("demo"), settings.quota_scopes("other")
        assert [key for key, _ in demo] == ["project:demo", "team:platform", "org:acme"]
        # three requests of demo (300 tokens and 0.5 each, estimated) and one of other, in flight
        held = [plane.store.reserve(demo, 300, 0.5) for _ in range(3)] + [plane.store.reserve(other, 300, 0.5)]
        assert all(isinstance(r, Reservation) for r in held)

        member, _csrf = await logged_in(plane, "ada@lab.example")
        async with aclosing(member):
            page = await member.get("/console/quotas")
            assert page.status_code == 200, page.text
            assert 'id="nav-quotas" aria-current="page"' in page.text and 'id="quotas-demo"' in page.text
            assert 'id="quotas-other"' not in page.text  # not their project
            assert rows(page.text, "demo") == {
                "project-demo-requests_per_minute": (3, 5), "project-demo-tokens_per_minute": (900, 1000),
                "team-platform-tokens_per_day": (1200, 50000), "team-platform-concurrent_requests": (4, 8),
                "org-acme-budget": (2.0, 100.0)}
            text = text_of(page.text)
            assert "project demo requests per minute 3 5 2" in text
            assert "team platform shared with other tokens per UTC day 1200 50000 48800" in text
            assert "organisation acme shared with other cost per UTC month 2.0000 USD 100.00 USD 98.0000" in text

            # what the page says is left is what the gateway's check admits: 100 tokens a minute, not 101
            refused = plane.store.reserve(demo, 101, 0.0)
            assert isinstance(refused, Rejection) and refused.limit_name == "tokens_per_minute" \
                and refused.remaining == 100
            admitted = plane.store.reserve(demo, 100, 0.0)
            assert isinstance(admitted, Reservation)
            page = await member.get("/console/quotas")
            assert rows(page.text, "demo")["project-demo-tokens_per_minute"] == (1000, 1000)
            assert rows(page.text, "demo")["project-demo-requests_per_minute"] == (4, 5)

            # ended requests leave the concurrency limit; the tokens they used stay counted
            for reservation in held:
                plane.store.settle(reservation, 300, 0.5)
            page = await member.get("/console/quotas")
            assert rows(page.text, "demo")["team-platform-concurrent_requests"] == (1, 8)
            assert rows(page.text, "demo")["team-platform-tokens_per_day"] == (1300, 50000)
            assert (await member.get("/console/nodes")).status_code == 403  # still a member's console

        viewer, _csrf = await logged_in(plane, "audit@lab.example")
        async with aclosing(viewer):
            page = await viewer.get("/console/quotas")
            assert page.status_code == 200 and 'id="quotas-demo"' in page.text and 'id="quotas-other"' in page.text
            assert rows(page.text, "other")["project-other-requests_per_minute"] == (1, 60)
            assert rows(page.text, "other")["team-platform-tokens_per_day"] == (1300, 50000)
        nursery.cancel_scope.cancel()

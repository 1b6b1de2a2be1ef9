"""A person's API keys in the console (issue 36), over HTTP on loopback against a real control plane, its store and
settings: a project member logged in sees only their projects' keys, makes one (its plaintext shown on that answer
once, never again, and the store takes it), is refused a key of a project they are not in and the revocation of
another project's key (403 with the admin API's sentence), and revokes their own (the store refuses it then); the key records them as who made and who revoked it, and the page
shows it. The
page goes through the admin API's /api/v1/keys routes as the person (`AdminApp.act`), the routes a person's admin
token uses (`llmgw keys` itself opens the store); a viewer reads every project's keys and makes none."""

from __future__ import annotations

import re
from contextlib import aclosing

import trio

from control.test_people_on_the_admin_api import PASSWORD, people_repo
from llmgw.cli.console_mount import console_mount
from llmgw.control import ControlConfig, ControlPlane

from .test_console_actions import logged_in, text_of

OTHER_PROJECT = "          other:\n            models: [tiny]\n"


def key_ids(page: str) -> list[str]:
    return re.findall(r'<tr id="key-([^"]+)"', page)


async def test_a_member_makes_and_revokes_their_own_projects_keys_from_the_console(tmp_path, weights_mirror):
    repo = people_repo(tmp_path, weights_mirror[1], projects_tail=OTHER_PROJECT)
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", gateway=False,
                                       admin_mounts=(console_mount,)))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        assert sorted(plane.snapshot().settings.projects) == ["demo", "other"]
        for email, name in (("ada@lab.example", "Ada Lovelace"), ("audit@lab.example", "Aud Itor")):
            plane.store.add_account(email, name, PASSWORD)
        theirs, _ = plane.store.create_api_key("other", "ci")  # another project's key, made by an operator

        member, csrf = await logged_in(plane, "ada@lab.example")
        async with aclosing(member):
            page = await member.get("/console/keys")
            assert page.status_code == 200 and 'id="nav-keys"' in page.text
            assert key_ids(page.text) == [] and "No key yet" in text_of(page.text)  # not the other project's
            assert re.findall(r'<option value="([^"]+)"', page.text) == ["demo"]  # their projects only

            made = await member.post("/console/keys/new", data={"csrf": csrf, "project": "demo", "name": "laptop"})
            assert made.status_code == 200, text_of(made.text)
            plaintext = re.search(r'<code class="key" id="new-key">([^<]+)</code>', made.text).group(1)
            assert plaintext.startswith("sk-llmgw-") and "shown this once" in text_of(made.text)
            assert made.headers["Cache-Control"] == "no-store" and 'data-refresh="0"' in made.text
            key = plane.store.authenticate(plaintext)
            assert key is not None and (key.project, key.name) == ("demo", "laptop")
            assert (key.created_by, key.revoked_by) == ("ada@lab.example", None)  # who made it, on the key

            page = await member.get("/console/keys")
            assert key_ids(page.text) == [key.key_id] and plaintext not in page.text  # shown once, never again
            assert f"{key.prefix}…" in page.text and f'id="revoke-{key.key_id}"' in page.text
            assert f'id="made-by-{key.key_id}">ada@lab.example<' in page.text

            # a project they are not in: refused by the admin API, in its words; nothing made
            refused = await member.post("/console/keys/new", data={"csrf": csrf, "project": "other"})
            assert refused.status_code == 403 and ("ada@lab.example is a member of demo, not of what this asks "
                                                   "(project other's keys)") in text_of(refused.text)
            refused = await member.post(f"/console/keys/{theirs.key_id}/revoke", data={"csrf": csrf})
            assert refused.status_code == 403 and "members see, make and revoke their own projects' keys" in \
                text_of(refused.text)
            assert [k.key_id for k in plane.store.list_api_keys("other") if k.revoked_at is None] == [theirs.key_id]
            assert (await member.post(f"/console/keys/{key.key_id}/revoke", data={})).status_code == 403  # no CSRF

            revoked = await member.post(f"/console/keys/{key.key_id}/revoke", data={"csrf": csrf})
            assert revoked.status_code == 200 and f"Revoked key {key.prefix}… (laptop) of project demo" in \
                text_of(revoked.text)
            assert plane.store.authenticate(plaintext) is None
            assert plane.store.list_api_keys("demo")[0].revoked_by == "ada@lab.example"
            page = await member.get("/console/keys")
            assert f'id="key-{key.key_id}" data-state="revoked"' in page.text
            assert f'id="revoked-by-{key.key_id}">ada@lab.example<' in page.text
            assert f'id="revoke-{key.key_id}"' not in page.text
            assert (await member.get("/console/nodes")).status_code == 403  # still a member's console

        viewer, csrf = await logged_in(plane, "audit@lab.example")
        async with aclosing(viewer):
            page = await viewer.get("/console/keys")
            assert sorted(key_ids(page.text)) == sorted([key.key_id, theirs.key_id])
            assert f'id="made-by-{theirs.key_id}">–<' in page.text  # made with the store's own call: nobody named
            assert 'id="new-key-form"' not in page.text and "revoke-" not in page.text
            refused = await viewer.post("/console/keys/new", data={"csrf": csrf, "project": "demo"})
            assert refused.status_code == 403 and "audit@lab.example is a viewer" in text_of(refused.text)
        nursery.cancel_scope.cancel()

"""Console actions as commits (issue 36, item 2), over HTTP on loopback against a real control plane and its bare
settings repository: each action shows the diff first and commits nothing until confirmed, then commits as the
person logged in (llmgw the committer) through the admin API's edit routes; a branch that moved meanwhile is a 409
with a sentence and nothing committed, an edit that would not validate is refused with `llmgw validate`'s words, a
viewer is refused with a sentence, and a member changes their own SSH keys only, which their Slurm user then lists."""

from __future__ import annotations

import html
from contextlib import aclosing
import re

import httpx
import pygit2
import trio

from control.test_in_process_fleet import commit_directly
from control.test_people_on_the_admin_api import KEY, PASSWORD, head, people_repo
from llmgw.cli.console_mount import console_mount
from llmgw.control import ControlConfig, ControlPlane
from llmgw.settings import load_commit

SLURM_USERS = "enabled: false\nusers: llmgw\nshared_path: /srv/shared\n"
ADAPTER_SHA = "d" * 64


def csrf_of(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


def form_with(page: str, marker: str) -> dict[str, str]:
    """The hidden fields of the form of `page` that holds `marker` (as a browser would send them)."""
    at = page.index(marker)
    form = page[page.rindex("<form", 0, at):page.index("</form>", at)]
    return {name: html.unescape(value) for name, value in re.findall(r'name="([^"]+)" value="([^"]*)"', form)}


def confirmation(page: str) -> dict[str, str]:
    """The fields of a preview's confirmation form (csrf, expect and the action's own)."""
    return form_with(page, 'id="confirm"')


def text_of(page: str) -> str:
    """The page's text as a person reads it (tags dropped, entities decoded, spaces folded)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


async def logged_in(plane, email: str) -> tuple[httpx.AsyncClient, str]:
    """A client with a console session of `email` (password login) and the session's CSRF token."""
    client = httpx.AsyncClient(base_url=plane.admin_url)
    page = await client.get("/console/login")
    answer = await client.post("/console/login", data={"csrf": csrf_of(page.text), "email": email,
                                                        "password": PASSWORD})
    assert answer.status_code == 303, answer.text
    return client, csrf_of((await client.get("/console/ssh-keys")).text)


async def test_each_action_shows_its_diff_then_commits_as_the_person_and_refusals_are_sentences(
    tmp_path, weights_mirror,
):
    repo = people_repo(tmp_path, weights_mirror[1])
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", gateway=False,
                                       admin_mounts=(console_mount,)))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        for email, name in (("ops@lab.example", "Olga Ops"), ("audit@lab.example", "Aud Itor"),
                            ("ada@lab.example", "Ada Lovelace")):
            plane.store.add_account(email, name, PASSWORD)
        operator, csrf = await logged_in(plane, "ops@lab.example")
        async with aclosing(operator):
            assert 'id="set-replicas-tiny"' in (await operator.get("/console/replicas")).text
            assert 'id="stop-serving"' in (await operator.get("/console/")).text

            # a preview: the diff, a form to confirm it, and nothing committed
            before = head(repo).id
            shown = await operator.post("/console/actions", data={"csrf": csrf, "action": "drain", "node": "n1",
                                                                   "back": "/console/nodes/n1"})
            assert shown.status_code == 200 and "+  drained: [n1]" in html.unescape(shown.text), shown.text
            assert "it will be committed as Olga Ops <ops@lab.example>" in text_of(shown.text)
            assert head(repo).id == before
            fields = confirmation(shown.text)
            assert fields["expect"] == str(before) and fields["action"] == "drain"
            done = await operator.post("/console/actions", data=fields)
            assert done.status_code == 200 and "Committed" in text_of(done.text), done.text
            commit = head(repo)
            assert commit.message == "llmgw node drain n1\n" and commit.parents[0].id == before
            assert (commit.author.name, commit.author.email, commit.committer.name) == (
                "Olga Ops", "ops@lab.example", "llmgw")
            assert plane.snapshot().settings.cluster.drained == ("n1",)  # the watcher read it before the answer

            # someone pushes between the diff and the confirmation: a 409 that says so, nothing committed
            shown = await operator.post("/console/actions", data={"csrf": csrf, "action": "replicas",
                                                                   "model": "tiny", "replicas": "2"})
            assert "-replicas: 1" in shown.text and "+replicas: 2" in shown.text
            tiny = (tmp_path / "seed" / "catalog" / "tiny.yaml").read_bytes()
            forge = await trio.to_thread.run_sync(commit_directly, repo, "catalog/tiny.yaml",
                                                  tiny.replace(b"replicas: 1", b"replicas: 3"), "tiny: three\n")
            refused = await operator.post("/console/actions", data=confirmation(shown.text))
            assert refused.status_code == 409
            assert (f'moved since this change was shown (it was at {str(commit.id)[:12]}; it is now at '
                    f'{forge[:12]}, "tiny: three" by Forge <forge@example.com>): nothing was committed') \
                in text_of(refused.text)
            assert str(head(repo).id) == forge  # not half-applied
            again = await operator.post("/console/actions", data=form_with(refused.text, 'id="again"'))
            # "Show the change again": a preview against the new head
            assert "-replicas: 3" in again.text and "+replicas: 2" in again.text
            assert confirmation(again.text)["expect"] == forge

            # an edit that would not validate: llmgw validate's words, file and line, nothing committed
            invalid = await operator.post("/console/actions", data={"csrf": csrf, "action": "replica-range",
                                                                     "model": "tiny", "min": "3", "max": "1"})
            assert invalid.status_code == 400 and "llmgw validate refuses this change" in text_of(invalid.text)
            assert re.search(r"catalog/tiny\.yaml:\d+", text_of(invalid.text)), text_of(invalid.text)
            bad_form = await operator.post("/console/actions", data={"csrf": csrf, "action": "replicas",
                                                                      "model": "tiny", "replicas": "many"})
            assert bad_form.status_code == 400 and "give a whole number" in text_of(bad_form.text)
            assert str(head(repo).id) == forge

            # an adapter joins the model and leaves it; serving stops: each a commit of theirs
            for data in ({"action": "adapter-add", "model": "tiny", "name": "tiny-pirate",
                          "weights": f"https://example.invalid/tiny/pirate.gguf {ADAPTER_SHA}\n"},
                         {"action": "stop"}):
                shown = await operator.post("/console/actions", data={"csrf": csrf, **data})
                assert shown.status_code == 200 and 'id="confirm"' in shown.text, text_of(shown.text)
                assert (await operator.post("/console/actions", data=confirmation(shown.text))).status_code == 200
                assert head(repo).author.email == "ops@lab.example"
            settings = load_commit(str(repo))
            assert settings.cluster.serving_stopped
            assert [a.name for a in settings.models["tiny"].adapters] == ["tiny-pirate"]
            assert 'class="remove-adapter"' in (await operator.get("/console/replicas")).text
            assert (await operator.post("/console/actions", data={"action": "stop"})).status_code == 403  # no CSRF

        viewer, csrf = await logged_in(plane, "audit@lab.example")
        async with aclosing(viewer):
            assert 'id="set-replicas-tiny"' not in (await viewer.get("/console/replicas")).text
            refused = await viewer.post("/console/actions", data={"csrf": csrf, "action": "cordon", "node": "n1"})
            assert refused.status_code == 403
            assert ("audit@lab.example is a viewer (projects.yaml people.viewers): viewers read everything and change "
                    "nothing") in text_of(refused.text)

        # a store token of nobody's with scope console reads the console and changes nothing
        reader = plane.store.create_token("console")[1]
        async with httpx.AsyncClient(base_url=plane.admin_url, headers={"Authorization": f"Bearer {reader}"}) as bot:
            page = await bot.get("/console/replicas")
            assert page.status_code == 200 and 'id="set-replicas-tiny"' not in page.text  # no form to act
            refused = await bot.post("/console/actions", data={"action": "cordon", "node": "n1"})
            assert refused.status_code == 403 and "(scope console) reads the console and changes nothing" in \
                text_of(refused.text)

        # a member adds their own SSH key (the e-mail field cannot make it someone else's), and no cluster action
        forge = await trio.to_thread.run_sync(commit_directly, repo, "slurm.yaml", SLURM_USERS.encode(),
                                              "slurm: users llmgw\n")
        plane.wake_watcher()
        with trio.fail_after(10):
            while plane.snapshot().settings.commit != forge:
                await trio.sleep(0.05)
        member, csrf = await logged_in(plane, "ada@lab.example")
        async with aclosing(member):
            page = await member.get("/console/ssh-keys")
            assert page.status_code == 200 and 'id="add-key"' in page.text and "No key yet" in page.text
            shown = await member.post("/console/actions", data={"csrf": csrf, "action": "ssh-key-add",
                                                                 "email": "ops@lab.example", "key": KEY})
            assert "ada@lab.example" in shown.text and "ops@lab.example" not in html.unescape(
                shown.text).split('id="action-diff"')[1].split("</pre>")[0]
            assert (await member.post("/console/actions", data=confirmation(shown.text))).status_code == 200
            assert (head(repo).author.name, head(repo).author.email) == ("Ada Lovelace", "ada@lab.example")
            assert KEY in (await member.get("/console/ssh-keys")).text
            refused = await member.post("/console/actions", data={"csrf": csrf, "action": "cordon", "node": "n1"})
            assert refused.status_code == 403 and "ada@lab.example is a member of demo" in text_of(refused.text)
        async with httpx.AsyncClient(base_url=plane.admin_url,
                                     headers={"Authorization": f"Bearer {plane.admin_token}"}) as admin:
            users = (await admin.get("/api/v1/slurm/users")).json()["users"]
        ada = next(u for u in users if u["email"] == "ada@lab.example")
        assert ada["keys"] == [KEY]  # the lines of her Slurm user's authorized_keys
        nursery.cancel_scope.cancel()
    assert pygit2.Repository(str(repo)).references["refs/heads/main"].peel(pygit2.Commit).author.email \
        == "ada@lab.example"

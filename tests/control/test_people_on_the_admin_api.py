"""People on a real control plane's admin listener, over HTTP on loopback (issue 36): a token that belongs to a
person does what their role in projects.yaml allows (a viewer reads and is refused any change with 403 and a
sentence, a member may change only their own SSH keys), every settings commit made for them has them as author and
llmgw as committer whatever the body claims, and a disabled account's tokens pass nothing. The console's password
login goes through the same store and settings."""

from __future__ import annotations

import json
import re

import httpx
import pygit2
import trio

from llmgw.cli.console_mount import console_mount
from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.admin import AdminApp
from llmgw.settings import init_repository

from .conftest import write_seed
from .test_cli_over_admin_api import llmgw

PASSWORD = "correct horse battery"
PEOPLE = "people:\n  operators: [ops@lab.example]\n  viewers: [audit@lab.example]\n"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHVjb25zdGFudGtleWZvcnRlc3RzMDAwMDAwMDAwMDAw ada@laptop"


def people_repo(tmp_path, sha: str, llmgw_yaml_tail: str = "", slurm_yaml: str = "enabled: false\n",
                projects_tail: str = "", files: dict[str, str] | None = None):
    """A bare settings repository serving "tiny", with PEOPLE and ada@lab.example a member of project demo
    (`llmgw_yaml_tail` appended to llmgw.yaml, `projects_tail` to the projects of team platform: more projects,
    their names indented by 10; `slurm_yaml` the text of slurm.yaml; `files` more files, by path, with their text)."""
    seed = write_seed(tmp_path / "seed", sha)
    (seed / "llmgw.yaml").write_text((seed / "llmgw.yaml").read_text() + llmgw_yaml_tail)
    projects = seed / "projects.yaml"
    projects.write_text(PEOPLE + projects.read_text().replace("models: [tiny]",
                                                              "models: [tiny]\n            members: [ada@lab.example]")
                        + projects_tail)
    (seed / "slurm.yaml").write_text(slurm_yaml)
    for path, text in (files or {}).items():
        (seed / path).parent.mkdir(parents=True, exist_ok=True)
        (seed / path).write_text(text)
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    return repo


async def wait_for_async(check, what: str, timeout: float = 20.0):
    """The first truthy answer of the awaitable `check()`, polled every 50 ms."""
    with trio.move_on_after(timeout):
        while not (value := await check()):
            await trio.sleep(0.05)
        return value
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def store_key_project(plane, plaintext: str) -> str | None:
    key = plane.store.authenticate(plaintext)
    return None if key is None else key.project


def head(repo) -> pygit2.Commit:
    return pygit2.Repository(str(repo)).references["refs/heads/main"].peel(pygit2.Commit)


async def test_each_person_does_what_their_role_allows_and_authors_their_commits(tmp_path, weights_mirror):
    repo = people_repo(tmp_path, weights_mirror[1])
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", gateway=False))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        tokens = {}
        for email, name in (("ops@lab.example", "Olga Ops"), ("audit@lab.example", "Aud Itor"),
                            ("ada@lab.example", "Ada Lovelace"), ("nobody@lab.example", "No Body")):
            plane.store.add_account(email, name, PASSWORD)
            tokens[email] = plane.store.create_token("admin", owner=email)[1]

        def client(email: str) -> httpx.AsyncClient:
            return httpx.AsyncClient(base_url=plane.admin_url, headers={"Authorization": f"Bearer {tokens[email]}"})

        async with client("audit@lab.example") as viewer, client("ops@lab.example") as operator, \
                client("ada@lab.example") as member, client("nobody@lab.example") as nobody:
            assert (await viewer.get("/api/v1/status")).status_code == 200
            refused = await viewer.post("/api/v1/nodes/n1/drain", json={})
            assert refused.status_code == 403 and refused.json()["error"]["message"] == (
                "audit@lab.example is a viewer (projects.yaml people.viewers): viewers read everything and change "
                "nothing; ask an operator to POST /api/v1/nodes/n1/drain.")
            code, out, err = await llmgw(plane, "node", "drain", "n1", token=tokens["audit@lab.example"])
            assert code == 1 and "error: audit@lab.example is a viewer (projects.yaml people.viewers)" in err, out + err
            before = head(repo).id
            member_refused = await member.get("/api/v1/status")
            assert member_refused.status_code == 403 and "ada@lab.example is a member of demo" in \
                member_refused.json()["error"]["message"]
            assert (await nobody.get("/api/v1/status")).json()["error"]["message"].startswith(
                "nobody@lab.example has no role")

            # the operator drains: the commit is theirs whatever the body claims, and llmgw commits it
            drained = await operator.post("/api/v1/nodes/n1/drain",
                                          json={"author_name": "Mallory", "author_email": "mallory@evil.example"})
            assert drained.status_code == 200 and drained.json()["author"] == "Olga Ops <ops@lab.example>"
            commit = head(repo)
            assert commit.parents[0].id == before and commit.message == "llmgw node drain n1\n"
            assert (commit.author.name, commit.author.email) == ("Olga Ops", "ops@lab.example")
            assert commit.committer.name == "llmgw"

            # a member adds their own SSH key, not someone else's
            own = await member.post("/api/v1/slurm/users/keys",
                                    json={"action": "add", "email": "ada@lab.example", "keys": [KEY]})
            assert own.status_code == 200, own.text
            assert head(repo).author.email == "ada@lab.example"
            other = await member.post("/api/v1/slurm/users/keys",
                                      json={"action": "add", "email": "ops@lab.example", "keys": [KEY]})
            assert other.status_code == 403

            # a member makes, lists and revokes their own project's keys, and no other's; a viewer reads them
            made = await member.post("/api/v1/keys", json={"project": "demo", "name": "laptop"})
            assert made.status_code == 200 and made.json()["key"].startswith("sk-llmgw-"), made.text
            assert store_key_project(plane, made.json()["key"]) == "demo"
            assert (await member.post("/api/v1/keys", json={"project": "ci"})).status_code == 400  # not in settings
            others = await operator.post("/api/v1/keys", json={"project": "demo"})
            assert (made.json()["created_by"], others.json()["created_by"]) == ("ada@lab.example", "ops@lab.example")
            assert [k["id"] for k in (await member.get("/api/v1/keys", params={"project": "demo"})).json()["keys"]] \
                == [made.json()["id"], others.json()["id"]]
            everyone = await member.get("/api/v1/keys")
            assert everyone.status_code == 403 and "not of what this asks (every project's keys)" in everyone.text
            assert (await viewer.get("/api/v1/keys")).status_code == 200
            assert (await viewer.post("/api/v1/keys", json={"project": "demo"})).status_code == 403
            revoked = await member.post(f"/api/v1/keys/{made.json()['id']}/revoke")
            assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
            assert (revoked.json()["created_by"], revoked.json()["revoked_by"]) == ("ada@lab.example",
                                                                                    "ada@lab.example")
            again = await operator.post(f"/api/v1/keys/{made.json()['id']}/revoke")  # idempotent: the first stays
            assert again.status_code == 200 and again.json()["revoked_by"] == "ada@lab.example"
            async with httpx.AsyncClient(base_url=plane.admin_url,
                                         headers={"Authorization": f"Bearer {plane.admin_token}"}) as nobody:
                plain = await nobody.post("/api/v1/keys", json={"project": "demo"})  # the plane's own token
                assert plain.status_code == 200 and plain.json()["created_by"] is None
            # `llmgw keys list` names them too
            code, out, err = await llmgw(plane, "keys", "list", "--state", str(tmp_path / "state"), "--json")
            assert code == 0, err
            by_id = {k["id"]: (k["created_by"], k["revoked_by"]) for k in json.loads(out)}
            assert by_id[made.json()["id"]] == ("ada@lab.example", "ada@lab.example")
            assert by_id[others.json()["id"]] == ("ops@lab.example", None)
            table = (await llmgw(plane, "keys", "list", "--state", str(tmp_path / "state")))[1]
            assert " created by " in table and " revoked by " in table and "ops@lab.example" in table
            assert plane.store.authenticate(made.json()["key"]) is None

            # the audit names the person behind each pass, and `llmgw history --author` finds theirs
            drain_commit = str(commit.id)

            async def passes_for(who: str) -> list[dict]:
                return (await viewer.get("/api/v1/history", params={"author": who, "limit": 50})).json()["entries"]

            mine = await wait_for_async(lambda: passes_for("ops@lab.example"), "an audit commit for Olga's drain")
            assert all("Settings-Author: Olga Ops <ops@lab.example>\n" in e["message"] for e in mine)
            assert f"Settings-Commit: {drain_commit}\nSettings-Author: Olga Ops <ops@lab.example>\n" in \
                mine[-1]["message"]
            assert all(not any("Olga" in line for line in e["message"].splitlines() if line.startswith("Settings-A"))
                       for e in await passes_for("ada@lab.example") if e not in mine)
            code, out, err = await llmgw(plane, "history", "--author", "olga", token=tokens["ops@lab.example"])
            assert code == 0 and len(out.splitlines()) == len(mine), out + err
            code, out, err = await llmgw(plane, "history", "--author", "mallory", token=tokens["ops@lab.example"])
            assert code == 0 and out == "" and "authored by 'mallory'" in err

            # a disabled account's tokens pass nothing
            plane.store.set_account_disabled("ops@lab.example", True)
            assert (await operator.get("/api/v1/status")).status_code == 401

        # the console's password login, as `llmgw server` mounts it
        console = console_mount(AdminApp(plane)).app
        browser = console.app.test_client()
        page = await browser.get("/console/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', await page.get_data(as_text=True)).group(1)
        wrong = await browser.post("/console/login", form={"csrf": csrf, "email": "audit@lab.example",
                                                           "password": "wrong password!"})
        assert wrong.status_code == 401
        viewer_in = await browser.post("/console/login", form={"csrf": csrf, "email": "Audit@lab.example",
                                                               "password": PASSWORD})
        assert viewer_in.status_code == 303
        nodes = await browser.get("/console/nodes", headers={"Accept": "text/html"})
        assert nodes.status_code == 200 and "viewer" in await nodes.get_data(as_text=True)
        session = next(iter(console.sessions._sessions.values()))
        assert (session.login.person, session.login.role, session.principal) == ("audit@lab.example", "viewer",
                                                                                  "Aud Itor")
        nursery.cancel_scope.cancel()


def test_who_may_use_which_projects_keys():
    from llmgw.control.admin_keys import keys_refusal
    from llmgw.settings import Access

    member = Access("ada@lab.example", "member", ("demo",))
    viewer = Access("aud@lab.example", "viewer")
    allowed = [(None, "POST", "x"), (Access("o@x", "operator"), "POST", None), (member, "GET", "demo"),
               (member, "POST", "demo"), (viewer, "GET", None), (viewer, "GET", "demo")]
    refused = [(member, "GET", None), (member, "POST", "ci"), (viewer, "POST", "demo"),
               (Access("n@x", None), "GET", "demo")]
    assert [keys_refusal(*case) for case in allowed] == [None] * len(allowed)
    assert all(keys_refusal(*case) for case in refused)

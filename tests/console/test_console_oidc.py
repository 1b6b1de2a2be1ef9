"""Logging in to the console through OpenID Connect (issue 36): the authorization code flow with PKCE against a
real, certified provider (npm `oidc-provider`, run by the test: `make oidc-provider` caches it under
~/.cache/llmgw/oidc), the e-mail's role from the settings as for a password; and the refusals: an authorization
request without PKCE (by the provider), a replayed callback, and ID tokens tampered with, of another audience or
with another login's nonce (`check_id_token`, with keys made here)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
import trio
from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

from llmgw.console import Console
from llmgw.console.oidc import OidcClient, OidcError, OidcSettings, check_id_token

from .test_console_accounts import Accounts
from .test_console_security import HTML, admin_only, no_history, state_with_one_gpu_node

HERE = Path(__file__).resolve().parent
OIDC_DIR = Path(os.environ.get("LLMGW_CACHE", Path.home() / ".cache" / "llmgw")) / "oidc"
CLIENT_ID, SECRET = "llmgw-console", "llmgw-console-test-secret"
REDIRECT = "http://127.0.0.1:9/console/oidc/callback"  # never contacted: the test hands the callback to the console


@pytest.fixture
def provider():
    """The issuer URL of a real oidc-provider on a free loopback port, stopped after the test."""
    if not (OIDC_DIR / "node_modules" / "oidc-provider").is_dir():
        pytest.fail(f"npm oidc-provider is needed in {OIDC_DIR}: run `make oidc-provider`", pytrace=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(["node", str(HERE / "oidc_provider.mjs"), str(port), REDIRECT],
                               env=dict(os.environ, OIDC_PROVIDER_DIR=str(OIDC_DIR)), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        while (line := process.stdout.readline()) and line.strip() != "ready":
            lines.append(line)
        assert line.strip() == "ready", "".join(lines)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(5)


def console_of(issuer: str) -> tuple[Console, Accounts]:
    accounts = Accounts()
    state = state_with_one_gpu_node()
    oidc = OidcClient(OidcSettings(issuer, CLIENT_ID, SECRET, REDIRECT))
    return Console(lambda: state, authorise=admin_only, history=no_history, accounts=accounts, oidc=oidc), accounts


def through_provider(url: str, login: str) -> httpx.Response:
    """A browser at the provider: its login page (any password) and consent page, until it sends the browser
    back; that last answer (a redirect to REDIRECT, or an error page)."""
    with httpx.Client(timeout=10) as browser:
        answer = browser.get(url)
        for _ in range(12):
            if answer.is_redirect:
                location = answer.headers["location"]
                if location.startswith(REDIRECT):
                    return answer
                answer = browser.get(answer.url.join(location))
                continue
            page = answer.text
            found = re.search(r'action="([^"]+)"', page)
            if found is None:
                return answer
            prompt = re.search(r'name="prompt" value="(\w+)"', page).group(1)
            form = {"prompt": prompt, **({"login": login, "password": "any"} if prompt == "login" else {})}
            answer = browser.post(answer.url.join(found.group(1)), data=form)
    raise AssertionError("the provider never sent the browser back")


async def test_a_member_logs_in_through_a_real_openid_provider_and_a_replay_is_refused(provider):
    console, _ = console_of(provider)
    client = console.app.test_client()
    assert "/console/oidc/start" in await (await client.get("/console/login")).get_data(as_text=True)
    start = await client.get("/console/oidc/start")
    url = start.headers["Location"]
    query = parse_qs(urlsplit(url).query)
    assert query["code_challenge_method"] == ["S256"] and len(query["code_challenge"][0]) == 43
    back = through_provider(url, "ada@lab.example")
    callback = "/console/oidc/callback?" + urlsplit(back.headers["location"]).query
    opened = await client.get(callback)
    assert opened.status_code == 303, await opened.get_data(as_text=True)
    usage = await client.get("/console/", headers=HTML)  # a member: sent to their usage
    assert usage.status_code == 303 and usage.headers["Location"] == "/console/usage"
    session = next(iter(console.sessions._sessions.values()))
    assert (session.login.person, session.login.role, session.login.projects) == ("ada@lab.example", "member",
                                                                                  ("demo",))
    replay = await console.app.test_client().get(callback)
    assert replay.status_code == 401 and "unknown or too old" in await replay.get_data(as_text=True)


async def test_someone_without_a_role_is_refused_and_the_provider_refuses_a_login_without_pkce(provider):
    console, _ = console_of(provider)
    client = console.app.test_client()
    url = (await client.get("/console/oidc/start")).headers["Location"]
    back = through_provider(url, "stranger@else.example")
    refused = await client.get("/console/oidc/callback?" + urlsplit(back.headers["location"]).query)
    assert refused.status_code == 403 and "stranger@else.example has no role here" in await refused.get_data(
        as_text=True)
    parts = urlsplit(url)
    bare = {k: v[0] for k, v in parse_qs(parts.query).items() if not k.startswith("code_challenge")}
    without = through_provider(f"{parts.scheme}://{parts.netloc}{parts.path}?{urlencode(bare)}", "ada@lab.example")
    said = parse_qs(urlsplit(without.headers.get("location", "")).query) if without.is_redirect else {}
    assert said.get("error") == ["invalid_request"] and "requires PKCE" in said["error_description"][0], without.text
    shown = await client.get("/console/oidc/callback?" + urlsplit(without.headers["location"]).query)
    assert shown.status_code == 401 and "refused the login: invalid_request" in await shown.get_data(as_text=True)


ISSUER = "https://id.example"
NOW = 1_800_000_000


def signed(key: RSAKey, **claims) -> str:
    base = {"iss": ISSUER, "aud": CLIENT_ID, "sub": "ada", "email": "ada@lab.example", "iat": NOW, "exp": NOW + 300,
            "nonce": "n-1"}
    return jwt.encode({"alg": "RS256", "kid": key.kid}, {**base, **claims}, key)


def tampered(token: str) -> str:
    """`token` with its e-mail claim rewritten and the signature kept."""
    import base64
    import json

    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["email"] = "ops@lab.example"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{signature}"


@pytest.mark.parametrize("case,make,reason", [
    ("its claims changed after signing", lambda key: tampered(signed(key)), "does not verify"),
    ("signed by another key", lambda key: signed(RSAKey.generate_key(2048, parameters={"kid": key.kid})),
     "does not verify"),
    ("another audience", lambda key: signed(key, aud="someone-else"), "is for someone-else, not this console"),
    ("another login's nonce", lambda key: signed(key, nonce="n-2"), "nonce is not this login's"),
    ("another issuer", lambda key: signed(key, iss="https://evil.example"), "claims are refused"),
    ("expired", lambda key: signed(key, exp=NOW - 3600), "claims are refused"),
    ("unsigned (alg none)", lambda key: "eyJhbGciOiJub25lIn0.eyJpc3MiOiJodHRwczovL2lkLmV4YW1wbGUifQ.",
     "does not verify"),
])
def test_an_id_token_is_refused_when(case, make, reason):
    key = RSAKey.generate_key(2048, parameters={"kid": "k1"}, private=True)
    keys = KeySet([key])
    assert check_id_token(signed(key), keys, ISSUER, CLIENT_ID, "n-1", NOW)["email"] == "ada@lab.example"
    with pytest.raises(OidcError, match=reason):
        check_id_token(make(key), keys, ISSUER, CLIENT_ID, "n-1", NOW)


async def test_llmgw_yaml_console_oidc_logs_a_member_in_on_a_real_control_plane(provider, tmp_path, weights_mirror):
    from control.test_people_on_the_admin_api import people_repo
    from llmgw.cli.console_mount import console_mount
    from llmgw.control import ControlConfig, ControlPlane
    from llmgw.control.admin import AdminApp

    oidc = (f"console:\n  oidc:\n    issuer: {provider}\n    client_id: {CLIENT_ID}\n    client_secret: oidc-client\n"
            f"    redirect_uri: {REDIRECT}\n")
    repo = people_repo(tmp_path, weights_mirror[1], llmgw_yaml_tail=oidc)
    (tmp_path / "state" / "secrets").mkdir(parents=True)
    (tmp_path / "state" / "secrets" / "oidc-client").write_text(SECRET + "\n")
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", gateway=False))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        assert plane.snapshot().settings.cluster.console_oidc.issuer == provider
        console = console_mount(AdminApp(plane)).app
        client = console.app.test_client()
        url = (await client.get("/console/oidc/start")).headers["Location"]
        assert url.startswith(provider + "/auth?")
        back = through_provider(url, "Ada@lab.example")
        opened = await client.get("/console/oidc/callback?" + urlsplit(back.headers["location"]).query)
        assert opened.status_code == 303, await opened.get_data(as_text=True)
        session = next(iter(console.sessions._sessions.values()))
        assert (session.login.person, session.login.role, session.login.projects) == ("ada@lab.example", "member",
                                                                                      ("demo",))
        nursery.cancel_scope.cancel()


async def test_a_member_logged_in_through_openid_acts_as_themselves_and_only_as_their_role_allows(
    provider, tmp_path, weights_mirror,
):
    """Acting after an OpenID login, over HTTP on the real admin listener: ada@lab.example (no local account: the
    provider vouches for her) adds her SSH key, a commit she authors (llmgw the committer), makes a key of her
    project, and is refused a cordon with the admin API's sentence, nothing committed."""
    from control.test_people_on_the_admin_api import KEY, head, people_repo
    from llmgw.cli.console_mount import console_mount
    from llmgw.control import ControlConfig, ControlPlane

    from .test_console_actions import SLURM_USERS, confirmation, csrf_of, text_of

    oidc = (f"console:\n  oidc:\n    issuer: {provider}\n    client_id: {CLIENT_ID}\n    client_secret: oidc-client\n"
            f"    redirect_uri: {REDIRECT}\n")
    repo = people_repo(tmp_path, weights_mirror[1], llmgw_yaml_tail=oidc, slurm_yaml=SLURM_USERS)
    (tmp_path / "state" / "secrets").mkdir(parents=True)
    (tmp_path / "state" / "secrets" / "oidc-client").write_text(SECRET + "\n")
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", gateway=False,
                                       admin_mounts=(console_mount,)))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        async with httpx.AsyncClient(base_url=plane.admin_url) as client:
            url = (await client.get("/console/oidc/start")).headers["Location"]
            back = await trio.to_thread.run_sync(through_provider, url, "ada@lab.example")
            opened = await client.get("/console/oidc/callback?" + urlsplit(back.headers["location"]).query)
            assert opened.status_code == 303, opened.text
            page = await client.get("/console/ssh-keys")
            assert page.status_code == 200 and 'id="add-key"' in page.text
            csrf = csrf_of(page.text)

            before = head(repo).id
            shown = await client.post("/console/actions", data={"csrf": csrf, "action": "ssh-key-add", "key": KEY})
            assert shown.status_code == 200 and "it will be committed as ada@lab.example <ada@lab.example>" in \
                text_of(shown.text), text_of(shown.text)
            done = await client.post("/console/actions", data=confirmation(shown.text))
            assert done.status_code == 200 and "Committed" in text_of(done.text), text_of(done.text)
            commit = head(repo)
            assert commit.parents[0].id == before
            assert (commit.author.email, commit.committer.name) == ("ada@lab.example", "llmgw")
            assert plane.snapshot().settings.slurm.ssh_keys["ada@lab.example"] == (KEY,)

            made = await client.post("/console/keys/new", data={"csrf": csrf, "project": "demo", "name": "sso"})
            assert made.status_code == 200 and 'id="new-key"' in made.text, text_of(made.text)

            refused = await client.post("/console/actions", data={"csrf": csrf, "action": "cordon", "node": "n1"})
            assert refused.status_code == 403 and "ada@lab.example is a member of demo" in text_of(refused.text)
            assert head(repo).id == commit.id  # nothing committed
        nursery.cancel_scope.cancel()

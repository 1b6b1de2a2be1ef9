"""The admin listener holds up (issue 26, item 1): it serves TLS under the agents' CA (or a given certificate), a
plain-text listener other machines reach is refused without --insecure, a trusted proxy's X-Forwarded-Proto/-For
count (nobody else's), the console's cookie is `Secure` behind an https proxy, and the git hook endpoint wants the
repository's hook token rather than trusting any loopback client."""

from __future__ import annotations

import ssl

import httpx
import pytest
import trio

from llmgw.cli.console_mount import console_mount
from llmgw.cli.main import main
from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.admin_listener import check_admin_listener, forwarded_scope, trusted_proxies
from llmgw.errors import UsageError
from llmgw.settings import HOOK_TOKEN_FILE, NOTIFY_CA_KEY
from llmgw.settings.hook import notification
from llmgw.settings.model import Listener


@pytest.mark.parametrize("host,tls,insecure,refused", [
    ("127.0.0.1", False, False, False), ("::1", False, False, False), ("localhost", False, False, False),
    ("0.0.0.0", False, False, True), ("", False, False, True), ("10.0.0.5", False, False, True),
    ("0.0.0.0", True, False, False), ("0.0.0.0", False, True, False),
])
def test_a_plain_admin_listener_off_loopback_is_refused_unless_tls_or_insecure(host, tls, insecure, refused):
    if refused:
        with pytest.raises(UsageError, match="refusing to serve the admin API.*--tls.*--admin-cert.*--insecure"):
            check_admin_listener(host, 8081, tls=tls, insecure=insecure)
    else:
        check_admin_listener(host, 8081, tls=tls, insecure=insecure)


def _scope(client: str, **headers: str) -> dict:
    return {"type": "http", "scheme": "http", "client": (client, 5000),
            "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]}


def test_forwarded_headers_count_only_from_trusted_proxies():
    proxies = trusted_proxies(["10.0.0.7", "10.1.0.0/24"])
    behind = forwarded_scope(_scope("10.0.0.7", x_forwarded_proto="https", x_forwarded_for="203.0.113.9, 10.1.0.4"),
                             proxies)
    assert behind["scheme"] == "https" and behind["client"][0] == "203.0.113.9"
    stranger = _scope("198.51.100.1", x_forwarded_proto="https", x_forwarded_for="127.0.0.1")
    assert forwarded_scope(stranger, proxies) is stranger  # a client's own headers are ignored
    # a client behind the proxy cannot pass itself off by prepending an address: the rightmost untrusted hop wins
    spoof = forwarded_scope(_scope("10.0.0.7", x_forwarded_for="127.0.0.1, 198.51.100.1"), proxies)
    assert spoof["client"][0] == "198.51.100.1" and spoof["scheme"] == "http"
    with pytest.raises(UsageError, match="'proxy.example' is not an IP address or network"):
        trusted_proxies(["proxy.example"])


def test_llmgw_server_refuses_a_plain_admin_listener_on_every_interface(tmp_path, settings_repo, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["server", "--repo", str(settings_repo), "--state", str(tmp_path / "state"), "--no-gateway",
              "--admin", "0.0.0.0:0", "--agents", "127.0.0.1:0"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "refusing to serve the admin API and the console in plain text on 0.0.0.0:0" in err
    assert "--insecure" in err and "Traceback" not in err


async def _login_cookie(client: httpx.AsyncClient, token: str, headers: dict[str, str]) -> str:
    """The Set-Cookie header of a console login with `token`."""
    form = await client.get("/console/login", headers=headers)
    csrf = form.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    # the login form's own cookie, sent back by hand: a Secure one is not sent over plain http by httpx (as a browser
    # talking to the https proxy would)
    nonce = form.headers["set-cookie"].split(";", 1)[0]
    client.cookies.clear()
    done = await client.post("/console/login", data={"csrf": csrf, "token": token},
                             headers={**headers, "Cookie": nonce})
    assert done.status_code == 303, done.text
    return done.headers["set-cookie"]


async def test_tls_admin_with_the_agents_ca_and_a_secure_cookie_behind_a_trusted_proxy(tmp_path, settings_repo):
    state = tmp_path / "state"
    plane = ControlPlane(ControlConfig(
        repo=str(settings_repo), state_dir=state, gateway=False, admin_tls=True, trusted_proxies=("127.0.0.1",),
        admin_listener=Listener(host="0.0.0.0", port=0), admin_mounts=(console_mount,)))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        assert plane.admin_url.startswith("https://127.0.0.1:")
        verify = ssl.create_default_context(cafile=str(state / "ca" / "ca.crt"))
        async with httpx.AsyncClient(base_url=plane.admin_url, verify=verify) as client:
            assert (await client.get("/api/v1/health")).status_code == 200
            cookie = await _login_cookie(client, plane.admin_token, {})
            assert "Secure" in cookie and "HttpOnly" in cookie
        async with httpx.AsyncClient(base_url=plane.admin_url) as unverified:
            with pytest.raises(httpx.ConnectError):  # not a certificate the system trusts: the CA is needed
                await unverified.get("/api/v1/health")
        nursery.cancel_scope.cancel()


async def test_behind_a_trusted_https_proxy_the_plain_listener_sets_a_secure_cookie(tmp_path, settings_repo):
    for trusted, secure in (((), False), (("127.0.0.0/8",), True)):
        plane = ControlPlane(ControlConfig(
            repo=str(settings_repo), state_dir=tmp_path / f"state{len(trusted)}", gateway=False,
            trusted_proxies=trusted, admin_mounts=(console_mount,)))
        async with trio.open_nursery() as nursery:
            await nursery.start(plane.run)
            async with httpx.AsyncClient(base_url=plane.admin_url) as client:
                cookie = await _login_cookie(client, plane.admin_token,
                                             {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"})
                assert ("Secure" in cookie) is secure, (trusted, cookie)
            nursery.cancel_scope.cancel()


async def test_the_git_hook_endpoint_wants_the_repository_hook_token_not_a_loopback_address(tmp_path, settings_repo):
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", gateway=False))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        token_file = settings_repo / HOOK_TOKEN_FILE
        assert token_file.stat().st_mode & 0o777 == 0o600
        message = notification([f"{'0' * 40} {'1' * 40} refs/heads/main"], settings_repo)
        assert message is not None and message.token == token_file.read_text().strip()
        async with httpx.AsyncClient(base_url=plane.admin_url) as client:
            refused = await client.post("/api/v1/hooks/git", content=b"{}")  # loopback, no token: refused
            assert refused.status_code == 401 and "hook token" in refused.json()["error"]["message"]
            wrong = await client.post("/api/v1/hooks/git", content=b"{}", headers={"X-Llmgw-Hook-Token": "nope"})
            assert wrong.status_code == 401
            woke = await client.post("/api/v1/hooks/git", content=message.body,
                                     headers={"X-Llmgw-Hook-Token": message.token})
            assert woke.status_code == 202
        nursery.cancel_scope.cancel()


async def test_a_tls_admin_listener_tells_the_hook_which_ca_to_verify(tmp_path, settings_repo):
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", gateway=False,
                                       admin_tls=True))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        message = notification([f"{'0' * 40} {'1' * 40} refs/heads/main"], settings_repo)
        assert message.url.startswith("https://") and message.ca_file == str(tmp_path / "state" / "ca" / "ca.crt")
        from llmgw.cli.hook_cmds import notify

        import io
        out = io.StringIO()
        assert await trio.to_thread.run_sync(notify, message, out), out.getvalue()
        nursery.cancel_scope.cancel()
    assert NOTIFY_CA_KEY == "llmgw.notifyca"


def test_the_ci_examples_create_and_use_a_review_scope_token():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "examples" / "ci"
    for path in sorted(root.rglob("*.yml")):
        text = path.read_text()
        assert "llmgw token create --scope review" in text, path
        assert "LLMGW_REVIEW_TOKEN" in text and "secrets.LLMGW_ADMIN_TOKEN" not in text, path

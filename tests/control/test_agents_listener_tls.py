"""A plain-text agents listener other machines can reach is refused unless `--insecure` is given (issue 19, item 6):
without TLS any peer could register under a node id, receive engine keys and be sent prompts."""

from __future__ import annotations

import pytest
import trio

from llmgw.cli.main import main
from llmgw.control import ControlConfig, ControlPlane
from llmgw.errors import WireError
from llmgw.settings.model import Listener
from llmgw.wire import check_agents_listener


@pytest.mark.parametrize("host,tls,insecure,refused", [
    ("127.0.0.1", False, False, False),
    ("127.0.0.7", False, False, False),
    ("::1", False, False, False),
    ("[::1]", False, False, False),
    ("localhost", False, False, False),
    ("0.0.0.0", False, False, True),
    ("", False, False, True),
    ("::", False, False, True),
    ("10.0.0.5", False, False, True),
    ("cp.example.org", False, False, True),
    ("0.0.0.0", True, False, False),
    ("0.0.0.0", False, True, False),
])
def test_plain_text_agents_listeners_are_allowed_only_on_loopback_unless_insecure(host, tls, insecure, refused):
    if refused:
        with pytest.raises(WireError, match="refusing to serve agents in plain text.*--tls.*--insecure"):
            check_agents_listener(host, 8082, tls=tls, insecure=insecure)
    else:
        check_agents_listener(host, 8082, tls=tls, insecure=insecure)


async def test_a_control_plane_with_plain_text_agents_on_every_interface_does_not_start(tmp_path, settings_repo):
    plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / "state", gateway=False,
                                       agents_listener=Listener(host="0.0.0.0", port=0)))
    with trio.fail_after(20), pytest.raises(WireError, match="plain text on 0.0.0.0"):
        await plane.run()


async def test_insecure_or_tls_lets_the_same_listener_start(tmp_path, settings_repo):
    for name, extra in (("insecure", {"insecure_agents": True}), ("tls", {"tls": True})):
        plane = ControlPlane(ControlConfig(repo=str(settings_repo), state_dir=tmp_path / name, gateway=False,
                                           agents_listener=Listener(host="0.0.0.0", port=0), **extra))
        async with trio.open_nursery() as nursery:
            await nursery.start(plane.run)
            assert plane.agents_port > 0
            nursery.cancel_scope.cancel()


def test_llmgw_server_refuses_plain_text_agents_off_loopback_and_names_the_ways_out(tmp_path, settings_repo, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["server", "--repo", str(settings_repo), "--state", str(tmp_path / "state"), "--no-gateway",
              "--admin", "127.0.0.1:0", "--agents", "0.0.0.0:0"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "refusing to serve agents in plain text on 0.0.0.0:0" in err
    assert "--tls" in err and "--insecure" in err and "Traceback" not in err

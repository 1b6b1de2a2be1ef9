"""The control planes' upgrade over ssh as data and decisions (llmgw.install.onboarding's server steps,
llmgw.cli.server_upgrade's order and waits), and the refusals of `llmgw upgrade --control-plane` before anything
runs. The whole upgrade on ssh hosts is tests/install/test_upgrade_control_planes.py."""

from __future__ import annotations

import pytest

from llmgw.cli.server_upgrade import PlaneOnHost, upgrade_order, wait_back
from llmgw.errors import InstallError, UsageError
from llmgw.install import onboarding
from support.in_process_cli import run_llmgw

FACTS = onboarding.NodeFacts("0.1.1", "wheels/llmgw-0.1.1-py3-none-any.whl", "cp2", "-", "", "/var/tmp/llmgw-upgrade",
                             ("manifest.json", "manifest.json.minisig", "llmgw-release.pub"), "release")


def test_the_standbys_go_first_the_leader_last_and_those_on_the_release_are_left_out():
    planes = [PlaneOnHost("cp1", "0.1.0", leads=True), PlaneOnHost("cp2", "0.1.0"), PlaneOnHost("cp3", "0.1.1"),
              PlaneOnHost("cp4", "0.1.0")]
    assert [p.host for p in upgrade_order(planes, "0.1.1")] == ["cp2", "cp4", "cp1"]
    assert upgrade_order([PlaneOnHost("cp1", "0.1.1", leads=True)], "0.1.1") == []


@pytest.mark.parametrize("planes, words", [
    ([PlaneOnHost("cp1", error="connection refused")], "the control plane on cp1 did not say what it runs "
                                                       "(connection refused)"),
    ([PlaneOnHost("cp1", "0.2.0")], "the control plane on cp1 runs llmgw 0.2.0, newer than the release (0.1.1): an "
                                    "upgrade never takes a control plane back"),
    ([PlaneOnHost("cp1", "0.1.0", True), PlaneOnHost("cp2", "0.1.0", True)], "cp1 and cp2 both say they lead"),
])
def test_an_order_that_cannot_be_kept_is_refused_naming_the_host(planes, words):
    with pytest.raises(UsageError) as refused:
        upgrade_order(planes, "0.1.1")
    assert words in str(refused.value)


def test_the_release_is_installed_beside_the_running_one_before_current_switches_and_the_plane_restarts():
    steps = [step.what for step in onboarding.server_upgrade_steps(FACTS)]
    assert steps == ["make the venv /opt/llmgw/0.1.1 (kept when it holds this release already)",
                     "install llmgw 0.1.1 into it from the release's wheels (no registry)",
                     "keep the release's signed manifest and the key that signed it in /opt/llmgw/0.1.1/release",
                     "link /opt/llmgw/current to 0.1.1", "restart the control plane from llmgw 0.1.1",
                     "remove /var/tmp/llmgw-upgrade"]
    commands = [step.command for step in onboarding.server_upgrade_steps(FACTS)]
    kept = "cmp -s /var/tmp/llmgw-upgrade/manifest.json /opt/llmgw/0.1.1/release/manifest.json || "
    assert all(command.startswith(kept) for command in commands[:3]), commands[:3]  # a switched-back try is kept
    assert "mv -T /opt/llmgw/.current.new /opt/llmgw/current" in commands[3]  # atomic: a rename over the link
    restart = commands[4]
    assert restart.startswith("touch /run/llmgw-server.restarted && ")  # ask_plane's mark, below
    assert "systemctl restart llmgw-server.service" in restart  # where systemd runs
    # elsewhere: SIGTERM to the user llmgw's `llmgw server`, a bounded wait, then started from server.env
    assert "pkill -TERM -u llmgw -f 'llmgw server --state /var/lib/llmgw/server'" in restart
    assert "did not exit within 90 s of SIGTERM" in restart
    assert ". /etc/llmgw/server.env" in restart and "setsid -f runuser -u llmgw -- /opt/llmgw/current/bin/llmgw " \
                                                    "server --state /var/lib/llmgw/server $LLMGW_SERVER_OPTIONS" in restart


def test_a_failure_before_the_switch_removes_only_a_venv_current_does_not_link_to_and_a_rollback_links_back():
    undo = [step.command for step in onboarding.server_upgrade_undo(FACTS)]
    assert undo == ['[ "$(readlink /opt/llmgw/current)" = 0.1.1 ] || rm -rf /opt/llmgw/0.1.1',
                    "rm -rf /var/tmp/llmgw-upgrade"]
    back = onboarding.server_rollback_steps(FACTS, "0.1.0")
    assert [step.what for step in back] == ["link /opt/llmgw/current back to 0.1.0",
                                            "restart the control plane from llmgw 0.1.0 again"]
    with pytest.raises(ValueError):
        onboarding.server_rollback_steps(FACTS, "0.1.0; rm -rf /")


def test_waiting_for_a_control_plane_polls_until_it_serves_the_version_and_fails_with_what_it_said_last(
        monkeypatch):
    answers = iter([PlaneOnHost("cp1", error="connection refused"), PlaneOnHost("cp1", "0.1.0"),
                    PlaneOnHost("cp1", "0.1.1")])
    monkeypatch.setattr("llmgw.cli.server_upgrade.ask_plane", lambda host, ssh: next(answers))
    now = [0.0]
    assert wait_back("cp1", [], "0.1.1", 10, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)) \
        == PlaneOnHost("cp1", "0.1.1")
    monkeypatch.setattr("llmgw.cli.server_upgrade.ask_plane", lambda host, ssh: PlaneOnHost("cp1", "0.1.0"))
    with pytest.raises(InstallError) as late:
        wait_back("cp1", [], "0.1.1", 3, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert str(late.value) == ("the control plane on cp1 did not answer with llmgw 0.1.1 within 3 s (it answers with "
                               "llmgw 0.1.0)")
    monkeypatch.setattr("llmgw.cli.server_upgrade.ask_plane",
                        lambda host, ssh: PlaneOnHost("cp1", "0.1.1", serves=False))  # back, its fleet not yet
    with pytest.raises(InstallError) as recovering:
        wait_back("cp1", [], "0.1.1", 3, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert "(its fleet is not back: its gateway does not serve yet)" in str(recovering.value)


def test_llmgw_upgrade_refuses_control_planes_without_a_key_and_control_planes_only_without_hosts(tmp_path):
    code, out, err = run_llmgw(["upgrade", str(tmp_path), "--control-plane", "cp1", "--url", "http://127.0.0.1:9",
                                "--token", "t"])
    assert code == 1 and "--control-plane needs --trusted-key or --settings" in err, out + err
    code, out, err = run_llmgw(["upgrade", str(tmp_path), "--control-planes-only", "--url", "http://127.0.0.1:9",
                                "--token", "t"])
    assert code == 1 and "--control-planes-only upgrades the --control-plane hosts: name them" in err, out + err


def test_server_upgrade_dry_run_prints_every_command_for_the_host_and_connects_to_nothing(bare_release):
    code, out, err = run_llmgw(["server", "upgrade", "cp2", "--release", str(bare_release.directory), "--trusted-key",
                                bare_release.trusted_key, "--dry-run"])
    assert code == 0, out + err
    whats = [line[2:] for line in out.splitlines() if line.startswith("# ")]
    assert whats == ["check that the host has Python 3.11 or newer, with venv (Debian: python3-venv)",
                     "copy the release into /var/tmp/llmgw-upgrade",
                     "check every file of the release against its signed digests",
                     "make the venv /opt/llmgw/0.1.0 (kept when it holds this release already)",
                     "install llmgw 0.1.0 into it from the release's wheels (no registry)",
                     "keep the release's signed manifest and the key that signed it in /opt/llmgw/0.1.0/release",
                     "link /opt/llmgw/current to 0.1.0", "restart the control plane from llmgw 0.1.0",
                     "remove /var/tmp/llmgw-upgrade"], out
    assert "ssh -o BatchMode=yes cp2 " in out and "< the release (tar)" in out


def test_the_poll_starts_no_llmgw_status_until_the_restarted_control_plane_wrote_its_admin_url(tmp_path, monkeypatch):
    """`ask_plane` after a restart (onboarding.RESTART_MARK touched by the restart step) answers from a shell test
    until the control plane wrote its admin-url again; then (and before any restart) `llmgw status` runs."""
    import os

    from llmgw.cli.server_upgrade import NOT_OPENED, ask_plane

    state, mark = tmp_path / "server", tmp_path / "restarted"
    state.mkdir()
    monkeypatch.setattr(onboarding, "SERVER_STATE", str(state))
    monkeypatch.setattr(onboarding, "RESTART_MARK", str(mark))
    monkeypatch.setattr(onboarding, "LLMGW", """echo '{"control_plane": {"version": "0.1.1", "leader": true}}' #""")
    shell = ["sh", "-c"]  # the host's shell, as ssh runs the command there
    assert ask_plane("cp1", shell) == PlaneOnHost("cp1", "0.1.1", True)  # never restarted: asked
    (state / "admin-url").write_text("https://127.0.0.1:8081\n")
    os.utime(state / "admin-url", (1, 1))  # written by the control plane before the restart
    mark.touch()
    assert ask_plane("cp1", shell) == PlaneOnHost("cp1", error=NOT_OPENED)
    (state / "admin-url").write_text("https://127.0.0.1:8081\n")  # the restarted one opened its admin API
    assert ask_plane("cp1", shell) == PlaneOnHost("cp1", "0.1.1", True)

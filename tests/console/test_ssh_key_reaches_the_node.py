"""An SSH key a project member adds in the console reaches their Slurm user's `authorized_keys` on a node (issue 36),
end to end: the console's action commits slurm.yaml `ssh_keys` as the member (through the admin API's route), the
control plane renders the node's part in Slurm with its users (UIDs from the store) and sends it with the agent
settings, and a real in-process agent's Slurm keeper makes the user (real useradd, with `--prefix` into a scratch
root: the machine's own accounts are never touched) and writes the key where sshd reads it. Slurm itself is
stood in for (tests/support/fake_slurm.py), the engine too: no real model."""

from __future__ import annotations

import html
from contextlib import aclosing
from pathlib import Path

import trio

from agent.test_slurm_users import entries, root  # noqa: F401 (a fixture)
from control.conftest import stand_in_agent
from control.test_in_process_fleet import wait_for
from control.test_people_on_the_admin_api import KEY, PASSWORD, head, people_repo
from llmgw.agent import run_agent
from llmgw.cli.console_mount import console_mount
from llmgw.control import ControlConfig, ControlPlane
from support.fake_slurm import fake_slurm

from .test_console_actions import confirmation, logged_in, text_of

SLURM_YAML = """\
enabled: true
cluster_name: lab
controller: ctl
nodes:
  n1: {{partition: gpu}}
partitions:
  gpu: {{default: true}}
users: llmgw
shared_path: {shared}
munge_key_secret: munge-key
proctrack_type: proctrack/linuxproc
task_plugin: task/none
"""


def authorized_keys(state: Path, login: str) -> str | None:
    """The text of `login`'s file in the agent's authorized_keys directory (sshd's `AuthorizedKeysFile`), or None."""
    path = state / "slurm" / "ssh" / "authorized_keys" / login
    return path.read_text() if path.exists() else None


async def test_a_key_added_in_the_console_is_written_into_the_members_authorized_keys_by_the_agent(
    tmp_path, weights_mirror, fake_engine, root,  # noqa: F811 (the fixture)
):
    mirror, sha = weights_mirror
    shared = tmp_path / "shared"
    shared.mkdir()
    repo = people_repo(tmp_path, sha, slurm_yaml=SLURM_YAML.format(shared=shared),
                       files={"agents/nodes/n1.yaml": "{}\n", "agents/nodes/ctl.yaml": "{}\n"})
    (tmp_path / "state" / "secrets").mkdir(parents=True)
    (tmp_path / "state" / "secrets" / "munge-key").write_text("k" * 48 + "\n")
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", gateway=False,
                                       admin_mounts=(console_mount,)))
    node_state = tmp_path / "n1"
    agent = stand_in_agent("n1", node_state, mirror, fake_engine, slurm_users_prefix=str(root),
                           slurm_programs=fake_slurm(tmp_path / "fake-slurm"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        await nursery.start(lambda task_status: run_agent(agent, plane.local_connector(), task_status=task_status))
        # the control plane gives ada (member of demo) UID 200000; the agent makes her user, with no key yet
        await wait_for(lambda: "ada" in entries(root), 30, "ada's user on n1", lambda: plane.status())
        ada = entries(root)["ada"]
        assert (ada.uid, ada.home, ada.gecos) == (200000, f"{shared}/home/ada", "llmgw user ada@lab.example")
        assert authorized_keys(node_state, "ada") is None

        plane.store.add_account("ada@lab.example", "Ada Lovelace", PASSWORD)
        member, csrf = await logged_in(plane, "ada@lab.example")
        async with aclosing(member):
            shown = await member.post("/console/actions", data={"csrf": csrf, "action": "ssh-key-add", "key": KEY})
            assert shown.status_code == 200, text_of(shown.text)
            diff = html.unescape(shown.text).split('id="action-diff"')[1].split("</pre>")[0]
            assert "+ssh_keys:" in diff and "ada@lab.example" in diff and KEY in diff, diff
            done = await member.post("/console/actions", data=confirmation(shown.text))
            assert done.status_code == 200 and "Committed" in text_of(done.text), text_of(done.text)
        commit = head(repo)
        assert commit.message.startswith("llmgw slurm users keys add")
        assert (commit.author.name, commit.author.email, commit.committer.name) == (
            "Ada Lovelace", "ada@lab.example", "llmgw")

        # the next pass configures n1 again (its users' keys changed); the agent writes the file sshd reads
        await wait_for(lambda: authorized_keys(node_state, "ada") is not None, 30, "ada's authorized_keys on n1",
                       lambda: plane.status()["nodes"]["n1"])
        assert authorized_keys(node_state, "ada") == KEY + "\n"
        path = node_state / "slurm" / "ssh" / "authorized_keys" / "ada"
        assert path.stat().st_mode & 0o777 == 0o644
        assert Path(ada.home).is_dir() and Path(ada.home).stat().st_uid == 200000
        nursery.cancel_scope.cancel()

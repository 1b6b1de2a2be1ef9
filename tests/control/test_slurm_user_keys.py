"""`llmgw slurm users list` and `llmgw slurm users keys add|list|remove`, run as real processes against a running
control plane: keys are commits of slurm.yaml `ssh_keys` authored by the operator, a bad key is refused with the
file and the reason, and each member's login and UID come from the store."""

from __future__ import annotations

import json

import pygit2
import trio

from llmgw.control import ControlConfig, ControlPlane

from .test_cli_over_admin_api import llmgw
from .test_slurm_cursor import slurm_repo

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx3WnJ0b2tlbi1mb3ItdGVzdHMtb25seS0wMDAwMDAw ada@laptop"
WHO = ("--author-name", "Op", "--author-email", "op@lab.example")


async def test_keys_are_commits_and_users_list_their_logins_and_uids(tmp_path, weights_mirror) -> None:
    repo = slurm_repo(tmp_path, weights_mirror[1])
    key_file = tmp_path / "id_ed25519.pub"
    key_file.write_text(f"# ada's laptop\n{KEY}\n\n")
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state"))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)

        code, out, err = await llmgw(plane, "slurm", "users", "keys", "add", "ada.lovelace@lab.example",
                                     str(key_file), *WHO)
        assert code == 0 and "added 1 key(s) of ada.lovelace@lab.example" in out, out + err
        head = pygit2.Repository(str(repo)).references["refs/heads/main"].peel(pygit2.Commit)
        assert head.message.startswith("llmgw slurm users keys add ada.lovelace@lab.example\n")
        assert head.author.name == "Op"
        assert KEY in head.tree["slurm.yaml"].data.decode()
        code, out, _ = await llmgw(plane, "slurm", "users", "keys", "add", "ada.lovelace@lab.example",
                                   str(key_file), *WHO)
        assert code == 0 and "nothing to add" in out

        code, out, err = await llmgw(plane, "slurm", "users", "list", "--json")
        assert code == 0, err
        users = json.loads(out)["users"]
        assert [(u["login"], u["uid"], u["member"]) for u in users] == [("ada-lovelace", 200000, True),
                                                                       ("bob", 200001, True)]
        assert users[0]["keys"] == [KEY] and users[0]["home"] == "/srv/shared/home/ada-lovelace"
        code, out, _ = await llmgw(plane, "slurm", "users", "keys", "list", "ada.lovelace@lab.example")
        assert out.splitlines() == ["ada.lovelace@lab.example (ada-lovelace): 1 key", f"  {KEY}"]

        bad = tmp_path / "bad.pub"
        bad.write_text('command="/bin/sh" ' + KEY + "\n")  # options are not taken: only plain key lines
        code, out, err = await llmgw(plane, "slurm", "users", "keys", "add", "bob@lab.example", str(bad), *WHO)
        assert code != 0 and "slurm.yaml" in err and "ssh_keys" in err, out + err

        code, out, err = await llmgw(plane, "slurm", "users", "keys", "remove", "ada.lovelace@lab.example",
                                     "ada@laptop", *WHO)  # by its comment
        assert code == 0 and "removed 1 key(s)" in out, out + err
        head = pygit2.Repository(str(repo)).references["refs/heads/main"].peel(pygit2.Commit)
        assert "ssh_keys" not in head.tree["slurm.yaml"].data.decode()
        nursery.cancel_scope.cancel()

"""Project members as Linux users on a Slurm node, with real shadow tools and a real store: the control plane's role
(llmgw.control.commands.slurm_role, users from llmgw.control.slurm_store on SQLite) applied by the agent's keeper,
whose useradd/usermod/groupadd run with `--prefix` into a scratch root holding its own /etc/passwd (the machine's
own accounts are never touched). Checked: UIDs from 200000, homes on the shared path, SSH keys where sshd reads
them, users llmgw did not make left alone, a UID never given twice, a member who left closed but kept."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from types import MappingProxyType

import pytest
import trio

from llmgw.agent.slurm import SlurmKeeper, SlurmLayout
from llmgw.control.commands import slurm_role
from llmgw.control.slurm_store import users_from_store
from llmgw.plan.types import Fleet
from llmgw.settings.model import ClusterSettings, Organisation, Project, Settings, Team
from llmgw.settings.slurm import SlurmNode, SlurmPartition, SlurmSettings
from llmgw.store import open_store
from llmgw.tools.linux_users import parse_passwd, parse_shadow_expiry


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx3WnJ0b2tlbi1mb3ItdGVzdHMtb25seS0wMDAwMDAw ada@laptop"
ADA, BOB = "ada.lovelace@lab.example", "bob@lab.example"


def settings_for(shared: Path, *members: str, keys: dict | None = None) -> Settings:
    slurm = SlurmSettings(enabled=True, cluster_name="lab", controller="n1",
                          nodes=MappingProxyType({"n1": SlurmNode("gpu")}),
                          partitions=MappingProxyType({"gpu": SlurmPartition(default=True)}),
                          users="llmgw", shared_path=str(shared), ssh_keys=MappingProxyType(keys or {}),
                          accounting=True)
    return Settings(
        cluster=ClusterSettings(name="t"), organisations=MappingProxyType({"lab": Organisation("lab")}),
        teams=MappingProxyType({"ml": Team("ml", "lab")}),
        projects=MappingProxyType({"train": Project("train", "ml", "lab", members=members)}), slurm=slurm)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A scratch root with its own /etc (the machine's files copied: its users are there, as on a real node)."""
    etc = tmp_path / "root" / "etc"
    etc.mkdir(parents=True)
    for name in ("passwd", "group", "shadow", "gshadow", "login.defs"):
        if Path("/etc", name).exists():
            shutil.copy(Path("/etc", name), etc / name)
    return tmp_path / "root"


def entries(root: Path) -> dict:
    return {entry.login: entry for entry in parse_passwd((root / "etc" / "passwd").read_text())}


def digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


async def test_members_become_users_with_homes_and_keys_and_leave_without_losing_them(tmp_path: Path,
                                                                                      root: Path) -> None:
    machine = {name: digest(f"/etc/{name}") for name in ("passwd", "group", "shadow")}
    shared = tmp_path / "shared"
    shared.mkdir()
    store = open_store(tmp_path / "store.sqlite3")
    layout = SlurmLayout(tmp_path / "slurm", users_prefix=str(root))
    try:
        async with trio.open_nursery() as nursery:
            keeper = SlurmKeeper(layout, nursery)

            settings = settings_for(shared, ADA, BOB, keys={ADA: (KEY,)})
            role = slurm_role(settings, Fleet(()), "n1", lambda name: "k" * 32, users_from_store(store, settings))
            assert [(u.login, u.uid, u.home) for u in role.users] == [
                ("ada-lovelace", 200000, f"{shared}/home/ada-lovelace"), ("bob", 200001, f"{shared}/home/bob")]
            assert await keeper.sync_users(role) == []

            made = entries(root)
            ada = made["ada-lovelace"]
            assert (ada.uid, ada.gid, ada.home, ada.gecos) == (200000, 200000, f"{shared}/home/ada-lovelace",
                                                               f"llmgw user {ADA}")
            home = Path(ada.home)
            assert home.is_dir() and home.stat().st_uid == 200000 and home.stat().st_mode & 0o777 == 0o700
            assert (layout.authorized_keys / "ada-lovelace").read_text() == KEY + "\n"
            assert not (layout.authorized_keys / "bob").exists()  # no key given: no file
            assert keeper.users_ready == 2
            # the Slurm accounts' users are the same logins
            assert [a.users for a in role.accounts if a.name == "train"] == [["ada-lovelace", "bob"]]

            (home / "results.txt").write_text("kept")
            # bob leaves the project: closed (expired), his row and UID kept; ada's keys go when she has none
            settings = settings_for(shared, ADA)
            role = slurm_role(settings, Fleet(()), "n1", lambda name: "k" * 32, users_from_store(store, settings))
            assert await keeper.sync_users(role) == []
            assert parse_shadow_expiry((root / "etc" / "shadow").read_text())["bob"] == "1"
            assert "bob" in entries(root) and (shared / "home" / "bob").is_dir()
            assert not (layout.authorized_keys / "ada-lovelace").exists()

            # a newcomer never gets bob's UID
            settings = settings_for(shared, ADA, "cy@lab.example")
            role = slurm_role(settings, Fleet(()), "n1", lambda name: "k" * 32, users_from_store(store, settings))
            assert await keeper.sync_users(role) == []
            assert entries(root)["cy"].uid == 200002
            assert (home / "results.txt").read_text() == "kept"  # no home is ever touched again
            nursery.cancel_scope.cancel()
    finally:
        store.close()
    assert {name: digest(f"/etc/{name}") for name in machine} == machine  # the machine's own accounts untouched


async def test_users_someone_else_made_are_left_alone_and_a_missing_shared_path_is_a_warning(tmp_path: Path,
                                                                                             root: Path) -> None:
    # the node has its own "bob", and someone else's user holds UID 200001
    with open(root / "etc" / "passwd", "a") as passwd, open(root / "etc" / "group", "a") as group:
        passwd.write("bob:x:5000:5000:Bob, by hand:/home/bob:/bin/sh\nzed:x:200001:5000::/home/zed:/bin/sh\n")
        group.write("bob:x:5000:\n")
    before = (root / "etc" / "passwd").read_text()
    store = open_store(tmp_path / "store.sqlite3")
    layout = SlurmLayout(tmp_path / "slurm", users_prefix=str(root))
    try:
        async with trio.open_nursery() as nursery:
            keeper = SlurmKeeper(layout, nursery)
            settings = settings_for(tmp_path / "not-mounted", "ada@lab.example", BOB)
            users = users_from_store(store, settings)
            assert [(u.login, u.uid) for u in users] == [("ada", 200000), ("bob", 200001)]
            warnings = await keeper.sync_users(slurm_role(settings, Fleet(()), "n1", lambda n: "k" * 32, users))
            assert warnings[0].startswith(f"the shared path {tmp_path / 'not-mounted'} is not present on this node")
            assert any(w.startswith("a user bob is on this node already and llmgw did not make it") for w in warnings)
            made = entries(root)
            assert made["ada"].uid == 200000 and not Path(made["ada"].home).exists()  # no home without the path
            assert made["bob"].uid == 5000 and made["bob"].gecos == "Bob, by hand"
            assert (root / "etc" / "passwd").read_text().startswith(before)  # only appended to
            nursery.cancel_scope.cancel()
    finally:
        store.close()

"""The `groupadd` / `useradd` / `usermod` commands that give a node the Linux users llmgw wants, and the parsers of
/etc/passwd, /etc/group and /etc/shadow they are decided from. Pure.

llmgw marks a user it makes with the GECOS field "llmgw user <email>" (MARK) and only ever changes users so marked:
a user or group of the same name or number that someone else made is left alone, with a warning. Nothing is ever
deleted: a user llmgw made who is no longer wanted (a member who left) is expired (`usermod -e 1`: no login, SSH
keys refused; files and home kept, the UID stays theirs), and unexpired if wanted again. Each user has a group of its
own name whose GID is its UID. Homes are not made by useradd (`-M`): the agent makes them on the shared path itself.

`prefix` runs every command with shadow's `--prefix DIR` (4.13, Debian 12): they then read and write DIR/etc/passwd,
group, shadow and gshadow instead of the machine's (what the tests do; `--root` would chroot and need the tools
inside). Formats: passwd(5), group(5), shadow(5); useradd(8), usermod(8), groupadd(8) of shadow 4.13.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmgw.tools.values import ParseError

MARK = "llmgw user "
"""How a GECOS field made by llmgw starts; the member's e-mail follows."""
EXPIRED = "1"
"""shadow(5)'s expiry field as `usermod -e 1` writes it (1970-01-02): the account llmgw closed."""

Command = tuple[str, ...]


@dataclass(frozen=True)
class UserSpec:
    """A user llmgw wants on the node: `login`, `uid` (= its group's GID), the member's `email`, `home`, `shell`."""

    login: str
    uid: int
    email: str
    home: str
    shell: str = "/bin/bash"

    @property
    def gecos(self) -> str:
        """MARK and the e-mail, with ':', ',' and line breaks (which passwd(5) cannot hold) as '_'."""
        text = MARK + self.email
        for bad in ":,\n\r":
            text = text.replace(bad, "_")
        return text


@dataclass(frozen=True)
class PasswdEntry:
    """One line of /etc/passwd."""

    login: str
    uid: int
    gid: int
    gecos: str
    home: str
    shell: str


@dataclass(frozen=True)
class UserPlan:
    """What to run and what it leaves: `commands` in order (argv lists), `ready` the wanted users that exist once
    they ran (homes and keys are theirs), `closed` the logins of users llmgw made that are no longer wanted (their
    keys go), `warnings` for users left alone, in words for the operator."""

    commands: tuple[Command, ...]
    ready: tuple[UserSpec, ...]
    closed: tuple[str, ...]
    warnings: tuple[str, ...]


def _fields(text: str, count: int, what: str) -> Iterable[list[str]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith(("#", "+", "-")):  # comments and NIS compat lines
            continue
        fields = line.split(":")
        if len(fields) < count:
            raise ParseError(what, f"{len(fields)} fields, not {count}", number, line)
        try:
            if what != "/etc/shadow":
                int(fields[2])
                if what == "/etc/passwd":
                    int(fields[3])
        except ValueError:
            raise ParseError(what, "a UID or GID that is not a number", number, line) from None
        yield fields


def parse_passwd(text: str) -> list[PasswdEntry]:
    """/etc/passwd (passwd(5): login:password:uid:gid:gecos:home:shell) as entries, in file order.
    Raises: ParseError naming the line, for a line with fewer than 7 fields or a UID/GID that is not a number."""
    return [PasswdEntry(f[0], int(f[2]), int(f[3]), f[4], f[5], f[6]) for f in _fields(text, 7, "/etc/passwd")]


def parse_group(text: str) -> dict[str, int]:
    """/etc/group (group(5): name:password:gid:members) as name -> GID.
    Raises: ParseError for a line with fewer than 4 fields or a GID that is not a number."""
    return {f[0]: int(f[2]) for f in _fields(text, 4, "/etc/group")}


def parse_shadow_expiry(text: str) -> dict[str, str]:
    """/etc/shadow (shadow(5), 9 fields) as login -> its account expiry field as written ("" when none).
    Raises: ParseError for a line with fewer than 9 fields."""
    return {f[0]: f[7] for f in _fields(text, 9, "/etc/shadow")}


def user_commands(wanted: Iterable[UserSpec], passwd: Iterable[PasswdEntry], groups: dict[str, int],
                  expiry: dict[str, str], prefix: str = "") -> UserPlan:
    """The commands that make the node's users match `wanted` (see the module docstring), given what the node's
    passwd, group and shadow hold now; () when they match already. `prefix`: shadow's --prefix DIR ("" for none)."""
    pre: Command = ("--prefix", prefix) if prefix else ()
    entries = list(passwd)
    by_login = {entry.login: entry for entry in entries}
    by_uid = {entry.uid: entry for entry in entries}
    gid_holders = {gid: name for name, gid in groups.items()}
    commands: list[Command] = []
    ready: list[UserSpec] = []
    warnings: list[str] = []
    wanted = list(wanted)
    for user in wanted:
        entry = by_login.get(user.login)
        if entry is None:
            holder = by_uid.get(user.uid)
            group_gid = groups.get(user.login)
            if holder is not None:
                warnings.append(f"UID {user.uid} of {user.login} ({user.email}) is held by {holder.login} on this "
                                f"node: {user.login} is not made here")
                continue
            if group_gid is None and user.uid in gid_holders:
                warnings.append(f"GID {user.uid} of {user.login} ({user.email}) is held by group "
                                f"{gid_holders[user.uid]} on this node: {user.login} is not made here")
                continue
            if group_gid is not None and group_gid != user.uid:
                warnings.append(f"a group {user.login} with GID {group_gid} is on this node already (llmgw gives "
                                f"{user.login} GID {user.uid}): {user.login} ({user.email}) is not made here")
                continue
            if group_gid is None:
                commands.append(("groupadd", *pre, "-g", str(user.uid), user.login))
            commands.append(("useradd", *pre, "-M", "-u", str(user.uid), "-g", str(user.uid), "-d", user.home,
                             "-s", user.shell, "-c", user.gecos, user.login))
            ready.append(user)
            continue
        if not entry.gecos.startswith(MARK):
            warnings.append(f"a user {user.login} is on this node already and llmgw did not make it: left alone, so "
                            f"{user.email} has no account made by llmgw here")
            continue
        if entry.uid != user.uid:
            warnings.append(f"{user.login} has UID {entry.uid} on this node, not {user.uid} as the store says: "
                            "llmgw never changes a UID, change it by hand or remove the user")
            continue
        change: list[str] = []
        if entry.home != user.home:
            change += ["-d", user.home]  # without -m: a home is never moved or deleted
        if entry.shell != user.shell:
            change += ["-s", user.shell]
        if entry.gecos != user.gecos:
            change += ["-c", user.gecos]
        if expiry.get(user.login, "") == EXPIRED:
            change += ["-e", ""]
        if change:
            commands.append(("usermod", *pre, *change, user.login))
        ready.append(user)
    logins = {user.login for user in wanted}
    closed = [entry.login for entry in entries if entry.gecos.startswith(MARK) and entry.login not in logins]
    for login in closed:
        if expiry.get(login, "") != EXPIRED:
            commands.append(("usermod", *pre, "-e", EXPIRED, login))
    return UserPlan(tuple(commands), tuple(ready), tuple(closed), tuple(warnings))

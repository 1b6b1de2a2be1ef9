"""The users a Slurm node gets (llmgw.tools.linux_users), decided from its passwd, group and shadow: llmgw makes and
changes only users it marked, leaves anyone else's user, group or UID alone with a warning, never deletes, and
closes (expires) a user whose member left."""

from __future__ import annotations

import pytest

from llmgw.tools.linux_users import (
    UserSpec,
    parse_group,
    parse_passwd,
    parse_shadow_expiry,
    user_commands,
)
from llmgw.tools.values import ParseError

PASSWD = """root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
postgres:x:106:114:PostgreSQL administrator,,,:/var/lib/postgresql:/bin/bash
bob:x:1000:1000:Bob the admin's own:/home/bob:/bin/bash
ada-lovelace:x:200000:200000:llmgw user ada.lovelace@lab.example:/shared/home/ada-lovelace:/bin/bash
old:x:200003:200003:llmgw user old@lab.example:/shared/home/old:/bin/bash
"""
GROUP = "root:x:0:\nbob:x:1000:\nada-lovelace:x:200000:\nold:x:200003:\nstaff:x:200005:\n"
SHADOW = "root:*:19000:0:99999:7:::\nada-lovelace:!:20788:0:99999:7:::\nold:!:20788:0:99999:7::1:\n"

ADA = UserSpec("ada-lovelace", 200000, "ada.lovelace@lab.example", "/shared/home/ada-lovelace")


def decide(*wanted: UserSpec, passwd: str = PASSWD, prefix: str = ""):
    return user_commands(wanted, parse_passwd(passwd), parse_group(GROUP), parse_shadow_expiry(SHADOW), prefix)


def test_a_new_member_gets_a_group_and_a_user_marked_as_llmgws_without_a_home_made_by_useradd() -> None:
    cy = UserSpec("cy", 200001, "cy@lab.example", "/shared/home/cy")
    plan = decide(ADA, cy, prefix="/tmp/root")
    assert plan.commands == (
        ("groupadd", "--prefix", "/tmp/root", "-g", "200001", "cy"),
        ("useradd", "--prefix", "/tmp/root", "-M", "-u", "200001", "-g", "200001", "-d", "/shared/home/cy",
         "-s", "/bin/bash", "-c", "llmgw user cy@lab.example", "cy"),
    )  # old (made by llmgw, no longer a member) is expired already: nothing to do for it
    assert [u.login for u in plan.ready] == ["ada-lovelace", "cy"] and plan.closed == ("old",)
    assert plan.warnings == ()


def test_a_member_who_left_is_closed_never_deleted() -> None:
    plan = decide()
    assert plan.commands == (("usermod", "-e", "1", "ada-lovelace"),)  # expired: no login, keys refused
    assert plan.closed == ("ada-lovelace", "old") and plan.ready == ()


def test_a_member_who_comes_back_is_opened_again_and_a_node_that_matches_needs_nothing() -> None:
    old = UserSpec("old", 200003, "old@lab.example", "/shared/home/old")
    plan = decide(ADA, old)
    assert plan.commands == (("usermod", "-e", "", "old"),) and plan.closed == ()
    matching = user_commands([ADA], parse_passwd(PASSWD), parse_group(GROUP), {}, "")
    assert matching.commands == (("usermod", "-e", "1", "old"),)  # old is not expired in this shadow: closed
    assert user_commands([ADA], parse_passwd(PASSWD), parse_group(GROUP), {"old": "1"}, "").commands == ()


@pytest.mark.parametrize(("user", "warning"), [
    (UserSpec("bob", 200001, "bob@lab.example", "/shared/home/bob"), "a user bob is on this node already and llmgw "
     "did not make it: left alone"),
    (UserSpec("cy", 1000, "cy@lab.example", "/h"), "UID 1000 of cy (cy@lab.example) is held by bob"),
    (UserSpec("cy", 200005, "cy@lab.example", "/h"), "GID 200005 of cy (cy@lab.example) is held by group staff"),
    (UserSpec("staff", 200009, "s@lab.example", "/h"), "a group staff with GID 200005 is on this node already"),
    (UserSpec("ada-lovelace", 200007, "ada.lovelace@lab.example", "/h"), "ada-lovelace has UID 200000 on this node, "
     "not 200007 as the store says: llmgw never changes a UID"),
])
def test_what_llmgw_did_not_make_is_left_alone_with_a_warning(user: UserSpec, warning: str) -> None:
    plan = decide(user)
    assert all(command[-1] != user.login for command in plan.commands)
    assert user.login not in [u.login for u in plan.ready]
    assert len(plan.warnings) == 1 and plan.warnings[0].startswith(warning)


def test_a_users_home_shell_and_email_are_changed_in_place_never_moved() -> None:
    moved = UserSpec("ada-lovelace", 200000, "ada@lab.example", "/mnt/new/home/ada-lovelace", "/bin/zsh")
    plan = decide(moved)
    assert plan.commands[0] == ("usermod", "-d", "/mnt/new/home/ada-lovelace", "-s", "/bin/zsh",
                                "-c", "llmgw user ada@lab.example", "ada-lovelace")
    assert "-m" not in plan.commands[0]


def test_a_comment_never_carries_what_passwd_cannot_hold() -> None:
    assert UserSpec("x", 1, "we:ird,x@lab", "/h").gecos == "llmgw user we_ird_x@lab"


@pytest.mark.parametrize(("parse", "text", "message"), [
    (parse_passwd, "root:x:0:0:root\n", "/etc/passwd: 5 fields, not 7 \\(line 1"),
    (parse_passwd, "# x\nroot:x:zero:0:root:/root:/bin/sh\n", "/etc/passwd: a UID or GID that is not a number \\(line 2"),
    (parse_group, "root:x\n", "/etc/group: 2 fields, not 4 \\(line 1"),
    (parse_shadow_expiry, "root:*:1\n", "/etc/shadow: 3 fields, not 9 \\(line 1"),
])
def test_a_damaged_users_file_is_a_parse_error_naming_the_line(parse, text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse(text)


def test_the_machines_own_files_parse() -> None:
    with open("/etc/passwd") as passwd, open("/etc/group") as group:
        entries = parse_passwd(passwd.read())
        assert entries[0].login == "root" and entries[0].uid == 0
        assert parse_group(group.read())["root"] == 0

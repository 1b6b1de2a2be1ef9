"""Projects as Slurm accounts (llmgw.plan.slurm_accounts): the sacctmgr commands, touching only what llmgw made."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from llmgw.plan.slurm_accounts import account_commands, login_of
from llmgw.settings.model import ClusterSettings, Organisation, Project, Settings, Team
from llmgw.tools.slurm import SlurmAccount, SlurmAssociation, parse_sacctmgr_accounts, parse_sacctmgr_assocs


def projects(**members: tuple[str, ...]) -> Settings:
    return Settings(
        cluster=ClusterSettings(name="t"), organisations=MappingProxyType({"acme": Organisation("acme")}),
        teams=MappingProxyType({"platform": Team("platform", "acme")}),
        projects=MappingProxyType({name: Project(name, "platform", "acme", members=m) for name, m in members.items()}))


@pytest.mark.parametrize(("email", "login"), [
    ("alice@acme.example", "alice"), ("Ada.Lovelace+x@acme.example", "ada-lovelace-x"), ("42@x", "u42"),
    ("a" * 40 + "@x", "a" * 32),
])
def test_logins_come_from_the_local_part_of_the_email(email: str, login: str) -> None:
    assert login_of(email) == login


def test_an_empty_slurm_gets_the_hierarchy_parents_first_and_the_members_as_users() -> None:
    commands = account_commands(projects(ci=("alice@acme.example",)), "c1", (), ())
    assert [c[:4] for c in commands] == [("-i", "add", "account", "org-acme"), ("-i", "add", "account", "team-platform"),
                                         ("-i", "add", "account", "ci"), ("-i", "add", "user", "alice")]
    assert "Parent=team-platform" in commands[2] and "Description=llmgw: project ci" in commands[2]
    assert commands[3][4:] == ("Account=ci", "Cluster=c1")


def test_a_slurm_that_matches_gets_no_command_and_only_llmgw_accounts_are_removed() -> None:
    settings = projects(ci=("alice@acme.example",))
    made = [SlurmAccount("org-acme", "llmgw: organisation acme", "acme"),
            SlurmAccount("team-platform", "llmgw: team platform", "acme"), SlurmAccount("ci", "llmgw: project ci", "acme")]
    assocs = [SlurmAssociation("c1", "ci", "alice", "")]
    assert account_commands(settings, "c1", made, assocs) == ()
    old = made + [SlurmAccount("gone", "llmgw: project gone", "acme"), SlurmAccount("physics", "by hand", "uni")]
    old_assocs = assocs + [SlurmAssociation("c1", "gone", "bob", ""), SlurmAssociation("c1", "physics", "carol", "")]
    assert account_commands(settings, "c1", old, old_assocs) == (
        ("-i", "delete", "user", "bob", "Account=gone", "Cluster=c1"),
        ("-i", "delete", "account", "gone"))


def test_an_account_of_the_same_name_made_by_hand_is_left_alone() -> None:
    commands = account_commands(projects(ci=("alice@acme.example",)), "c1",
                                [SlurmAccount("ci", "made by an administrator", "x")], ())
    assert not [c for c in commands if "ci" in c or "alice" in c]


def test_sacctmgr_lines_parse_and_bad_ones_are_parse_errors() -> None:
    assert parse_sacctmgr_assocs("t|root||\n") == (SlurmAssociation("t", "root", "", ""),)
    assert parse_sacctmgr_accounts("ci|llmgw: project ci|acme\n") == (SlurmAccount("ci", "llmgw: project ci", "acme"),)
    from llmgw.tools.values import ParseError

    with pytest.raises(ParseError, match="sacctmgr show assoc"):
        parse_sacctmgr_assocs("t|root\n")


def _apply(commands, accounts: dict[str, SlurmAccount], assocs: set[tuple[str, str]], cluster: str) -> None:
    """What sacctmgr does with the commands, on a model of its accounts and (account, user) associations."""
    for command in commands:
        verb, kind, name = command[1:4]
        fields = dict(word.split("=", 1) for word in command[4:])
        if (verb, kind) == ("add", "account"):
            assert name not in accounts
            accounts[name] = SlurmAccount(name, fields["Description"], fields["Organization"])
        elif (verb, kind) == ("add", "user"):
            assert fields["Account"] in accounts and fields["Cluster"] == cluster
            assocs.add((fields["Account"], name))
        elif (verb, kind) == ("delete", "user"):
            assocs.discard((fields["Account"], name))
        else:
            assert not any(a == name for a, _ in assocs), f"{name} deleted with users"
            del accounts[name]


@pytest.mark.parametrize("seed", range(40))
def test_commands_converge_in_one_step_and_never_touch_an_administrators_account(seed: int) -> None:
    import random

    rng = random.Random(seed)
    people = [f"user{i}@acme.example" for i in range(6)]

    def random_settings() -> Settings:
        names = rng.sample(["ci", "demo", "train", "eval", "physics"], rng.randint(0, 5))
        return projects(**{n: tuple(rng.sample(people, rng.randint(0, 3))) for n in names})

    accounts = {"root": SlurmAccount("root", "default root account", "root")}
    if rng.random() < 0.5:
        accounts["physics"] = SlurmAccount("physics", "by hand", "uni")
    assocs: set[tuple[str, str]] = {("physics", "carol")} if "physics" in accounts else set()
    hand_made = {name: a for name, a in accounts.items()}
    for _ in range(3):
        settings = random_settings()
        state = lambda: (list(accounts.values()), [SlurmAssociation("c1", a, u, "") for a, u in sorted(assocs)])  # noqa: E731
        _apply(account_commands(settings, "c1", *state()), accounts, assocs, "c1")
        assert account_commands(settings, "c1", *state()) == ()
        assert all(accounts.get(name) == account for name, account in hand_made.items())
        if "physics" in hand_made:
            assert ("physics", "carol") in assocs
        for name in settings.projects:
            if name not in hand_made:
                assert {u for a, u in assocs if a == name} == {login_of(m) for m in settings.projects[name].members}

"""The Linux users of Slurm nodes in the store, on SQLite and PostgreSQL: a member's login and UID are given once and
kept, a UID is never given again (not even after the member left), and a login another member holds is not taken."""

from __future__ import annotations

import pytest

from llmgw.errors import StoreError
from llmgw.plan.slurm_users import FIRST_UID, login_candidates
from llmgw.store import Store

NOW = 1_800_000_000.0


def offer(*emails: str) -> list[tuple[str, tuple[str, str]]]:
    return [(email, login_candidates(email)) for email in emails]


def test_members_get_uids_from_200000_up_and_keep_them(store: Store) -> None:
    first = store.assign_slurm_users(offer("ada.lovelace@lab.example", "bob@lab.example"), FIRST_UID, NOW)
    assert [(u.login, u.uid) for u in first] == [("ada-lovelace", 200000), ("bob", 200001)]
    # asked again (every CONFIGURE does), in another order and with a newcomer: the same rows, the next UID
    again = store.assign_slurm_users(offer("cy@lab.example", "bob@lab.example", "ada.lovelace@lab.example"),
                                     FIRST_UID, NOW + 60)
    assert [(u.email, u.login, u.uid) for u in again] == [
        ("cy@lab.example", "cy", 200002), ("bob@lab.example", "bob", 200001),
        ("ada.lovelace@lab.example", "ada-lovelace", 200000)]
    assert again[2].created_at == NOW  # not given again
    assert [u.uid for u in store.slurm_users()] == [200000, 200001, 200002]


def test_a_uid_is_never_reused_after_its_member_left(store: Store) -> None:
    store.assign_slurm_users(offer("ada@lab.example", "bob@lab.example"), FIRST_UID, NOW)
    # bob leaves every project: nothing asks for him any more, but his row stays
    [dan] = store.assign_slurm_users(offer("dan@lab.example"), FIRST_UID, NOW + 60)
    assert dan.uid == 200002
    assert {u.login for u in store.slurm_users()} == {"ada", "bob", "dan"}
    [bob] = store.assign_slurm_users(offer("bob@lab.example"), FIRST_UID, NOW + 120)  # he comes back: the same UID
    assert (bob.login, bob.uid) == ("bob", 200001)


def test_two_members_whose_emails_make_one_login_get_two_logins(store: Store) -> None:
    [first] = store.assign_slurm_users(offer("ada.lovelace@a.example"), FIRST_UID, NOW)
    [second] = store.assign_slurm_users(offer("Ada-Lovelace@b.example"), FIRST_UID, NOW)
    assert first.login == "ada-lovelace"
    assert second.login == login_candidates("Ada-Lovelace@b.example")[1]
    assert second.login.startswith("ada-lovelace-") and len(second.login) == len("ada-lovelace-") + 8


def test_no_free_login_is_refused_and_writes_nothing(store: Store) -> None:
    store.assign_slurm_users([("a@x", ("ada",)), ("b@x", ("bob",))], FIRST_UID, NOW)
    with pytest.raises(StoreError, match="no login is free for c@x: ada, bob"):
        store.assign_slurm_users([("d@x", ("dan",)), ("c@x", ("ada", "bob"))], FIRST_UID, NOW)
    assert [u.login for u in store.slurm_users()] == ["ada", "bob"]  # dan's row went with the transaction


def test_the_store_refuses_a_second_row_for_a_login_or_uid(store: Store) -> None:
    store.assign_slurm_users([("a@x", ("ada",))], FIRST_UID, NOW)
    with pytest.raises(StoreError):
        store.insert_rows("slurm_users", [("z@x", "zed", 200000, NOW)])
    with pytest.raises(StoreError):
        store.insert_rows("slurm_users", [("z@x", "ada", 200009, NOW)])

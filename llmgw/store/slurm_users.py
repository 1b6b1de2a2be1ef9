"""The Linux users llmgw makes on Slurm nodes (slurm.yaml `users: llmgw`): one row per project member's e-mail,
with the login and UID it was given the first time, kept for good.

Rows are never deleted or changed: a member who leaves keeps the row, so the UID is never given to anyone else
(files on the shared path keep their owner's number), and a member who comes back gets the same login and UID.
A new UID is one more than the highest ever given, at least `first_uid`. Which login a member gets is the
caller's rule (`llmgw.plan.slurm_users`): it passes the logins to try in order, and the first one nobody holds is
taken, inside the same transaction that reads the table (two control planes assigning at once: the second waits
on SQLite's write lock; on PostgreSQL the table's unique constraints refuse the loser, a StoreError to retry).
Functions taking a connection run inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.errors import StoreError
from llmgw.store.dialects import SqlConnection
from llmgw.store.records import SlurmUser


def list_users(conn: SqlConnection) -> list[SlurmUser]:
    """Every row, by UID."""
    rows = conn.execute("SELECT email, login, uid, created_at FROM slurm_users ORDER BY uid").fetchall()
    return [SlurmUser(row[0], row[1], int(row[2]), float(row[3])) for row in rows]


def assign_users(conn: SqlConnection, wanted: Sequence[tuple[str, Sequence[str]]], first_uid: int,
                 now: float) -> list[SlurmUser]:
    """Give every e-mail of `wanted` ((email, logins to try in order)) that has no row yet a login and the next
    UID; returns the rows of all of `wanted`'s e-mails, in `wanted`'s order. Raises StoreError when every login
    offered for an e-mail is held by others (nothing is written then)."""
    existing = list_users(conn)
    by_email = {user.email: user for user in existing}
    taken = {user.login for user in existing}
    next_uid = max([first_uid - 1, *(user.uid for user in existing)]) + 1
    out: list[SlurmUser] = []
    for email, logins in wanted:
        user = by_email.get(email)
        if user is None:
            login = next((login for login in logins if login not in taken), None)
            if login is None:
                raise StoreError(f"no login is free for {email}: {', '.join(logins)} are all held by other members")
            user = by_email[email] = SlurmUser(email, login, next_uid, now)
            conn.execute("INSERT INTO slurm_users (email, login, uid, created_at) VALUES (?, ?, ?, ?)",
                         (email, login, next_uid, now))
            taken.add(login)
            next_uid += 1
        out.append(user)
    return out

"""What the control plane keeps of Slurm in its store (issue 15): the members' Linux users and the sacct cursor.

- Users (slurm.yaml `users: llmgw`): `users_from_store` asks the store for every member's login and UID (given the
  first time a member is seen and kept for good: `Store.assign_slurm_users`, `llmgw.plan.slurm_users`) and returns
  the users every Slurm node should have.
- The sacct cursor: the time (unix seconds) up to which the ended jobs of a Slurm cluster are recorded into usage,
  under the key/value entry "slurm.sacct_cursor.<cluster>". It only moves forward. It goes to the controller's agent
  with each CONFIGURE (`SlurmRole.finished_since`) and after each recording (SlurmJobsRecorded), so a restarted
  control plane has its agent read from where the last one stopped: nothing read again but the agent's margin
  (`llmgw.agent.slurm.CURSOR_MARGIN`, recorded once by request id), nothing missed however long it was away.

The functions are blocking (the store): call them through `trio.to_thread.run_sync`.
"""

from __future__ import annotations

from llmgw.plan.slurm_users import FIRST_UID, WantedUser, login_candidates, member_emails, wanted_users
from llmgw.settings.model import Settings
from llmgw.store import Store


def users_from_store(store: Store, settings: Settings) -> tuple[WantedUser, ...]:
    """The Linux users of `settings`' project members, logins and UIDs assigned by the store where new; () unless
    slurm.yaml says `users: llmgw`. Raises StoreError (from the store) when an assignment collided: retry."""
    emails = member_emails(settings)
    if not emails:
        return ()
    rows = store.assign_slurm_users([(email, login_candidates(email)) for email in emails], FIRST_UID)
    return wanted_users(settings, [(row.email, row.login, row.uid) for row in rows])


def cursor_key(cluster: str) -> str:
    """The key/value entry holding `cluster`'s sacct cursor."""
    return f"slurm.sacct_cursor.{cluster}"


def read_cursor(store: Store, cluster: str) -> float:
    """`cluster`'s sacct cursor (unix seconds), 0.0 when none is kept yet."""
    value = store.get(cursor_key(cluster))
    try:
        return float(value) if value else 0.0
    except ValueError:
        return 0.0


def advance_cursor(store: Store, cluster: str, until: float) -> float:
    """Move `cluster`'s cursor to `until` unless it is there or further already; returns the cursor afterwards."""
    now = read_cursor(store, cluster)
    if until > now:
        store.put(cursor_key(cluster), repr(until))
        return until
    return now

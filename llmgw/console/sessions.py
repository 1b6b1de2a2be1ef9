"""The console's login sessions: random ids kept in memory, each with its principal, CSRF token and expiry, the
id of the store token it logged in with (None for the control plane's own admin token or an account's password),
and the person it belongs to (`person`, an e-mail: an account's login, or the owner of the token) with their role
and projects. A session's token and person are checked again (revoked? expired? account disabled? role taken
away in projects.yaml?) at least every RECHECK_SECONDS (`Session.due`): such sessions end within a minute.

The id travels in a cookie (HttpOnly, SameSite=Strict, Secure over TLS, path /console); the CSRF token in every
form. Sessions live in the control plane's memory: a restart of the control plane logs everyone out. Times are
unix seconds passed in by the caller (no clock here).
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, replace

SESSION_TTL = 8 * 3600.0
"""Seconds a session lasts after login (it is not extended by use)."""
MAX_SESSIONS = 1000
"""Sessions kept at most; the oldest go first."""
RECHECK_SECONDS = 60.0
"""Seconds at most between two checks of a session's store token."""


@dataclass(frozen=True)
class Login:
    """Who a check let in: `principal` (a name for pages), the store token's id (`token_id`; None for the control
    plane's own admin token, which no store can revoke, and for a password login), the `person` (an e-mail; None:
    a token of nobody's) and what they may do: `role` ("operator", "viewer" or "member", llmgw.settings.people;
    a token of nobody's is "operator", as the admin token) and, for a member, their `projects`."""

    principal: str
    token_id: str | None = None
    person: str | None = None
    role: str = "operator"
    projects: tuple[str, ...] = ()


@dataclass(frozen=True)
class Session:
    """One login: `principal` (who logged in, as the check named it), `csrf` token, `expires` (unix s), the
    store token's id (`token_id`, None: the plane's own or a password), when it was last checked (`checked`, unix
    s), and the `login` it was opened with (refreshed by each check: a role can change with the settings)."""

    session_id: str
    principal: str
    csrf: str
    expires: float
    token_id: str | None = None
    checked: float = 0.0
    login: Login | None = None

    def due(self, now: float) -> bool:
        """Whether this session's store token or person must be checked again before it is used at `now`."""
        person = self.login is not None and self.login.person is not None
        return (self.token_id is not None or person) and now - self.checked >= RECHECK_SECONDS


class SessionBook:
    """The open sessions by id. Not shared across control planes (a standby's console asks for its own login)."""

    def __init__(self, ttl: float = SESSION_TTL):
        self.ttl = ttl
        self._sessions: dict[str, Session] = {}

    def open(self, principal: str, now: float, token_id: str | None = None, login: Login | None = None) -> Session:
        """A new session for `principal` (logged in with store token `token_id`, None: the plane's own or a
        password; `login`: the whole check's answer), valid for `ttl` seconds from `now`."""
        self._expire(now)
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.pop(next(iter(self._sessions)))
        session = Session(secrets.token_urlsafe(32), principal, secrets.token_urlsafe(32), now + self.ttl,
                          token_id, now, login or Login(principal, token_id))
        self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str | None, now: float) -> Session | None:
        """The live session of `session_id`, or None (unknown, expired or no id)."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None or session.expires <= now:
            self._sessions.pop(session_id, None)
            return None
        return session

    def checked(self, session: Session, now: float, login: Login | None = None) -> Session:
        """`session` with its token and person found still valid at `now` (kept, if the session is still open);
        `login`: what the person may do now (None: unchanged)."""
        renewed = replace(session, checked=now, login=login or session.login)
        if session.session_id in self._sessions:
            self._sessions[session.session_id] = renewed
        return renewed

    def close(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def _expire(self, now: float) -> None:
        for session_id in [k for k, s in self._sessions.items() if s.expires <= now]:
            del self._sessions[session_id]


def csrf_matches(expected: str, given: str | None) -> bool:
    """Whether a form's CSRF token is the session's (constant-time)."""
    return bool(given) and hmac.compare_digest(expected.encode(), str(given).encode())

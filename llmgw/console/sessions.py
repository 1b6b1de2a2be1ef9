"""The console's login sessions: random ids kept in memory, each with its principal, CSRF token and expiry, and
the id of the store token it logged in with (None for the control plane's own admin token). A session's token is
checked again (revoked? expired?) at least every RECHECK_SECONDS (`Session.due`): a revoked token's sessions end
within a minute.

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
    """Who a token check let in: `principal` (a name for pages) and the store token's id (`token_id`; None for the
    control plane's own admin token, which no store can revoke)."""

    principal: str
    token_id: str | None = None


@dataclass(frozen=True)
class Session:
    """One login: `principal` (who logged in, as the token check named it), `csrf` token, `expires` (unix s), the
    store token's id (`token_id`, None: the plane's own token) and when it was last checked (`checked`, unix s)."""

    session_id: str
    principal: str
    csrf: str
    expires: float
    token_id: str | None = None
    checked: float = 0.0

    def due(self, now: float) -> bool:
        """Whether this session's store token must be checked again before it is used at `now`."""
        return self.token_id is not None and now - self.checked >= RECHECK_SECONDS


class SessionBook:
    """The open sessions by id. Not shared across control planes (a standby's console asks for its own login)."""

    def __init__(self, ttl: float = SESSION_TTL):
        self.ttl = ttl
        self._sessions: dict[str, Session] = {}

    def open(self, principal: str, now: float, token_id: str | None = None) -> Session:
        """A new session for `principal` (logged in with store token `token_id`, None: the plane's own), valid for
        `ttl` seconds from `now`."""
        self._expire(now)
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.pop(next(iter(self._sessions)))
        session = Session(secrets.token_urlsafe(32), principal, secrets.token_urlsafe(32), now + self.ttl,
                          token_id, now)
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

    def checked(self, session: Session, now: float) -> Session:
        """`session` with its token found still valid at `now` (kept, if the session is still open)."""
        renewed = replace(session, checked=now)
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

"""The console's login sessions: random ids kept in memory, each with its principal, CSRF token and expiry.

The id travels in a cookie (HttpOnly, SameSite=Strict, Secure over TLS, path /console); the CSRF token in every
form. Sessions live in the control plane's memory: a restart of the control plane logs everyone out. Times are
unix seconds passed in by the caller (no clock here).
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

SESSION_TTL = 8 * 3600.0
"""Seconds a session lasts after login (it is not extended by use)."""
MAX_SESSIONS = 1000
"""Sessions kept at most; the oldest go first."""


@dataclass(frozen=True)
class Session:
    """One login: `principal` (who logged in, as the token check named it), `csrf` token, `expires` (unix s)."""

    session_id: str
    principal: str
    csrf: str
    expires: float


class SessionBook:
    """The open sessions by id. Not shared across control planes (a standby's console asks for its own login)."""

    def __init__(self, ttl: float = SESSION_TTL):
        self.ttl = ttl
        self._sessions: dict[str, Session] = {}

    def open(self, principal: str, now: float) -> Session:
        """A new session for `principal`, valid for `ttl` seconds from `now`."""
        self._expire(now)
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.pop(next(iter(self._sessions)))
        session = Session(secrets.token_urlsafe(32), principal, secrets.token_urlsafe(32), now + self.ttl)
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

    def close(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def _expire(self, now: float) -> None:
        for session_id in [k for k, s in self._sessions.items() if s.expires <= now]:
            del self._sessions[session_id]


def csrf_matches(expected: str, given: str | None) -> bool:
    """Whether a form's CSRF token is the session's (constant-time)."""
    return bool(given) and hmac.compare_digest(expected.encode(), str(given).encode())

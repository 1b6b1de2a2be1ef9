"""The console's session book (`llmgw.console.sessions`), pure: sessions live side by side until each one's own expiry,
and the oldest go first when the book is full."""

from __future__ import annotations

from llmgw.console.sessions import MAX_SESSIONS, SessionBook, csrf_matches


def test_opening_a_session_keeps_every_live_one_and_drops_only_the_expired():
    book = SessionBook(ttl=100.0)
    old = book.open("admin", now=0.0)
    first = book.open("admin", now=50.0)
    second = book.open("ops", now=99.0)
    assert book.get(old.session_id, 99.0) == old and book.get(first.session_id, 99.0) == first
    third = book.open("ops", now=100.0)  # `old` expires at 100: dropped; the others stay
    assert book.get(old.session_id, 100.0) is None
    assert [book.get(s.session_id, 100.0) for s in (first, second, third)] == [first, second, third]
    assert book.get(first.session_id, 150.0) is None and book.get(second.session_id, 150.0) == second
    assert len({s.session_id for s in (old, first, second, third)} | {s.csrf for s in (old, first, second, third)}) == 8


def test_closing_one_session_keeps_the_others_and_unknown_ids_are_none():
    book = SessionBook(ttl=100.0)
    a, b = book.open("admin", 0.0), book.open("admin", 1.0)
    book.close(a.session_id)
    book.close("no-such-session")
    assert book.get(a.session_id, 2.0) is None and book.get(b.session_id, 2.0) == b
    assert book.get(None, 2.0) is None and book.get("", 2.0) is None


def test_a_full_book_drops_its_oldest_session_first():
    book = SessionBook(ttl=1e9)
    sessions = [book.open("admin", float(n)) for n in range(MAX_SESSIONS + 2)]
    now = float(MAX_SESSIONS + 2)
    assert [book.get(s.session_id, now) for s in sessions[:2]] == [None, None]
    assert all(book.get(s.session_id, now) == s for s in sessions[2:])


def test_a_csrf_token_matches_only_itself():
    assert csrf_matches("token", "token")
    assert not csrf_matches("token", "tokeN") and not csrf_matches("token", None) and not csrf_matches("token", "")

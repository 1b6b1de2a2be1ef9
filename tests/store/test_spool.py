"""The usage spool: what a request leaves to write survives crashes and reaches the store exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from llmgw.errors import StoreError, TemporaryError
from llmgw.routes import Quota
from llmgw.store import Reservation, Settlement, StoreBoundary, UsageRecord, UsageSpool, charged
from llmgw.store.spool import decode_line, encode_settlement

NOW = 1_800_000_000.0


def settlement(entry_id: str, reservation: Reservation | None = None, tokens: int | None = 7,
               with_charges: bool = False, at: float = NOW + 1) -> Settlement:
    record = UsageRecord(project="chat", model="gemma", time=at, key_id="key_1", prompt_tokens=3,
                         completion_tokens=4, status=200)
    return Settlement(entry_id=entry_id, time=at,
                      reservation_id=reservation.reservation_id if reservation else None,
                      has_slots=bool(reservation and reservation.slots), actual_tokens=tokens, usage=record,
                      charges=charged(reservation) if with_charges else None)


CRASHING = textwrap.dedent("""
    import os, signal, sys
    from llmgw.store import Settlement, UsageRecord, UsageSpool, open_store
    store_url, spool_dir, stage = sys.argv[1:4]
    spool = UsageSpool(spool_dir)
    entry = Settlement(entry_id="stl_crash", time=1.0, usage=UsageRecord(project="chat", model="gemma", time=1.0,
                       prompt_tokens=5, completion_tokens=6))
    spool.append(entry)
    if stage == "after-store":
        open_store(store_url).apply_settlement(entry)  # committed, but the spool never hears of it
    elif stage == "marked-done":  # committed and marked done, the mark waiting for the spool's next line
        spool.claim(entry.entry_id)
        open_store(store_url).apply_settlement(entry)
        spool.finish(entry.entry_id, done=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("stage", ["before-store", "after-store", "marked-done"])
def test_a_settlement_spooled_before_a_sigkill_lands_in_the_store_exactly_once(store, tmp_path: Path,
                                                                               stage: str) -> None:
    spool_dir = tmp_path / "spool"
    crashed = subprocess.run([sys.executable, "-c", CRASHING, store.url, str(spool_dir), stage], timeout=60)
    assert crashed.returncode == -signal.SIGKILL
    assert len(store.recent_usage()) == (0 if stage == "before-store" else 1)

    spool = UsageSpool(spool_dir)
    assert [s.entry_id for s in spool.pending()] == ["stl_crash"]
    boundary = StoreBoundary(store, spool)
    assert trio.run(boundary.drain)
    trio.run(boundary.drain)
    spool.close()
    assert [(r.prompt_tokens, r.completion_tokens) for r in store.recent_usage()] == [(5, 6)]
    assert UsageSpool(spool_dir).pending() == []


@pytest.mark.parametrize("with_charges", [False, True], ids=["charges-from-the-row", "charges-carried"])
def test_applying_one_settlement_twice_writes_its_usage_and_frees_its_slot_once(store, with_charges) -> None:
    scopes = [("project:chat", Quota(concurrent_requests=1, tokens_per_minute=1000))]
    reservation = store.reserve(scopes, 100, 0.0, NOW)
    assert isinstance(reservation, Reservation)
    entry = settlement("stl_twice", reservation, tokens=7, with_charges=with_charges)
    assert store.apply_settlement(entry) is True
    assert store.apply_settlement(entry) is False
    assert len(store.recent_usage()) == 1
    assert store.headroom(scopes, NOW + 2).tokens.remaining == 1000 - 7
    assert isinstance(store.reserve(scopes, 10, 0.0, NOW + 2), Reservation)  # the slot was freed


@pytest.mark.parametrize("tokens", [7, None], ids=["settled", "released"])
def test_a_settlement_carrying_its_charges_moves_the_windows_as_one_that_reads_them(store, tokens) -> None:
    """Reserved in one minute, settled 61 s later: the estimate leaves its one-second bucket, the actual tokens go to
    the bucket of the settle time (none when released), whichever way the charges are found, also when one
    settlement is replayed. At NOW + 60.5 both buckets are in the sliding minute, at NOW + 122 neither."""
    scopes = [("project:chat", Quota(tokens_per_minute=1000, tokens_per_day=10_000))]
    seen = []
    for with_charges in (False, True):
        project = f"project:chat-{with_charges}"
        limited = [(project, limits) for _scope, limits in scopes]
        reservation = store.reserve(limited, 100, 0.0, NOW)
        entry = settlement(f"stl_{with_charges}", reservation, tokens=tokens, with_charges=with_charges,
                           at=NOW + 61)
        store.apply_settlement(entry)
        store.apply_settlement(entry)
        seen.append([(h.tokens.remaining, h.requests) for h in (store.headroom(limited, NOW + 60.5),
                                                                 store.headroom(limited, NOW + 122))])
    assert seen[0] == seen[1]
    assert seen[1][0][0] == 1000 - (tokens or 0) and seen[1][1][0] == 1000


def test_a_spooled_settlement_keeps_its_charges(store) -> None:
    reservation = store.reserve([("project:chat", Quota(tokens_per_minute=1000))], 100, 0.0, NOW)
    entry = settlement("stl_line", reservation, with_charges=True)
    assert entry.charges and decode_line(encode_settlement(entry).rstrip(b"\n")) == entry


class _Failing:
    """A real store whose settlements fail while `error` is set (a store that is down or locked); its other calls go
    through. No `call_nowait`: the boundary writes in worker threads."""

    call_nowait = None

    def __init__(self, store, error: Exception | None) -> None:
        self.store, self.error = store, error

    def apply_settlements(self, settlements):
        if self.error is not None:
            raise self.error
        return self.store.apply_settlements(settlements)

    def __getattr__(self, name):
        return getattr(self.store, name)


@pytest.mark.parametrize("error", [TemporaryError("the store is locked", delay=1.0), StoreError("the store is down")],
                         ids=["temporary", "store-error"])
async def test_a_settlement_the_store_failed_to_take_is_not_marked_done(store, tmp_path: Path, error) -> None:
    """The spool keeps an entry until the store has it: a failed write leaves no done mark, in memory or in the file,
    so the entry is written when the store is back (also after a restart), once."""
    failing = _Failing(store, error)
    spool = UsageSpool(tmp_path)
    boundary = StoreBoundary(failing, spool, settle_wait=5.0)
    assert await boundary.settle(settlement("stl_a")) is False
    assert await boundary.drain() is False
    assert [s.entry_id for s in spool.pending()] == ["stl_a"] and boundary.statistics()["last_error"] == str(error)
    spool.append(settlement("stl_b"))  # a done mark would be written with this line
    boundary.close()
    assert b'"done"' not in (tmp_path / "usage.spool").read_bytes()
    assert store.recent_usage() == []
    reopened = UsageSpool(tmp_path)
    assert [s.entry_id for s in reopened.pending()] == ["stl_a", "stl_b"]
    failing.error = None
    boundary = StoreBoundary(failing, reopened)
    assert await boundary.drain() is True
    boundary.close()
    assert sorted(r.time for r in store.recent_usage()) == [NOW + 1, NOW + 1]
    assert UsageSpool(tmp_path).pending() == []


def test_an_entry_finished_without_the_store_stays_pending(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path)
    spool.append(settlement("stl_a"))
    assert spool.claim("stl_a") is not None
    spool.finish("stl_a", done=False)
    assert [s.entry_id for s in spool.pending()] == ["stl_a"]
    assert spool.claim("stl_a") is not None  # claimable again, by the next retry
    spool.finish("stl_a", done=False)
    spool.append(settlement("stl_b"))
    spool.close()
    assert [s.entry_id for s in UsageSpool(tmp_path).pending()] == ["stl_a", "stl_b"]


def test_a_torn_last_line_is_cut_off_and_the_entries_before_it_are_kept(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path)
    spool.append(settlement("stl_a"))
    spool.append(settlement("stl_b"))
    spool.finish("stl_a", done=False)
    spool.close()
    with open(tmp_path / "usage.spool", "ab") as handle:
        handle.write(b'{"settle": {"entry_id": "stl_c", "ti')  # a crash in the middle of a write
    again = UsageSpool(tmp_path)
    assert [s.entry_id for s in again.pending()] == ["stl_a", "stl_b"]
    assert (tmp_path / "usage.spool").read_bytes().endswith(b"\n")
    assert again.pending()[0] == settlement("stl_a")
    again.close()


def test_entries_marked_done_are_not_pending_after_reopening(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path)
    for name in ("a", "b", "c"):
        spool.append(settlement(f"stl_{name}"))
    assert spool.claim("stl_b") is not None
    assert spool.claim("stl_b") is None  # claimed: another thread may not write it at the same time
    spool.finish("stl_b", done=True)
    assert spool.claim("stl_b") is None  # done
    spool.close()
    assert [s.entry_id for s in UsageSpool(tmp_path).pending()] == ["stl_a", "stl_c"]


def test_a_done_mark_is_written_with_the_next_line_and_the_last_ones_at_close(tmp_path: Path) -> None:
    """One write per settlement: an entry's done mark waits for the spool's next line (or its closing)."""
    path = tmp_path / "usage.spool"
    spool = UsageSpool(tmp_path)
    spool.append(settlement("stl_a"))
    size = path.stat().st_size
    spool.claim("stl_a")
    spool.finish("stl_a", done=True)
    assert path.stat().st_size == size and spool.pending() == []
    spool.append(settlement("stl_b"))
    assert [decode_line(line) for line in path.read_bytes().splitlines()[1:]] == [settlement("stl_b"), "stl_a"]
    spool.claim("stl_b")
    spool.finish("stl_b", done=True)
    spool.close()
    assert decode_line(path.read_bytes().splitlines()[-1]) == "stl_b"
    assert UsageSpool(tmp_path).pending() == []


def test_a_grown_spool_is_rewritten_with_only_its_pending_entries(tmp_path: Path) -> None:
    spool = UsageSpool(tmp_path, compact_bytes=2000)
    for index in range(20):
        spool.append(settlement(f"stl_{index:02d}"))
    for index in range(19):
        spool.claim(f"stl_{index:02d}")
        spool.finish(f"stl_{index:02d}", done=True)
    assert os.path.getsize(tmp_path / "usage.spool") < 2000
    spool.append(settlement("stl_late"))
    spool.close()
    assert [s.entry_id for s in UsageSpool(tmp_path).pending()] == ["stl_19", "stl_late"]


def test_a_second_opening_of_a_spool_in_use_is_refused_with_a_sentence(tmp_path: Path) -> None:
    first = UsageSpool(tmp_path)
    with pytest.raises(StoreError, match="in use by another process"):
        UsageSpool(tmp_path)
    first.close()
    UsageSpool(tmp_path).close()


def test_an_unreadable_line_in_the_middle_is_skipped_counted_and_the_others_kept(tmp_path: Path, caplog) -> None:
    spool = UsageSpool(tmp_path)
    spool.append(settlement("stl_a"))
    spool.close()
    with open(tmp_path / "usage.spool", "ab") as handle:
        handle.write(b"not json at all\n")
    spool = UsageSpool(tmp_path)
    spool.append(settlement("stl_b"))
    spool.close()
    with caplog.at_level("WARNING", logger="llmgw.store"):
        again = UsageSpool(tmp_path)
    assert [s.entry_id for s in again.pending()] == ["stl_a", "stl_b"]
    assert again.statistics()["damaged_lines"] == 1 and "1 unreadable lines" in caplog.text
    again.close()


def test_a_request_open_when_its_process_died_is_billed_once_and_a_settled_one_as_settled(
        store, tmp_path: Path) -> None:
    """`open_entry` (gateway workers' journal): an entry opened and never settled (the process was killed) becomes
    pending when the spool is opened again and lands in the store once; one opened then settled counts as settled;
    compaction keeps the entries still open."""
    spool_dir = tmp_path / "spool"
    spool = UsageSpool(spool_dir, compact_bytes=1)
    killed, finished = settlement("req_killed", tokens=140), settlement("req_finished", tokens=7)
    spool.open_entry(killed)
    spool.open_entry(finished)
    spool.append(finished)  # the second request settled (its real usage supersedes what was opened)
    assert spool.statistics()["open"] == 1 and [s.entry_id for s in spool.pending()] == ["req_finished"]
    boundary = StoreBoundary(store, spool)
    assert trio.run(boundary.drain)  # the store takes req_finished; the done mark compacts the file (1 byte limit)
    spool.close()  # as if SIGKILLed: the open entry is still in the (compacted) file

    again = UsageSpool(spool_dir)
    assert again.statistics()["abandoned"] == 1 and [s.entry_id for s in again.pending()] == ["req_killed"]
    assert trio.run(StoreBoundary(store, again).drain)
    again.close()
    assert UsageSpool(spool_dir).pending() == []
    assert store.usage_of_request("req_killed") is not None and store.usage_of_request("req_finished") is not None
    assert len(store.recent_usage()) == 2

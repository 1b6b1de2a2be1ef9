"""Files of /v1/files and batches of /v1/batches in the store, on SQLite and PostgreSQL: a file's bytes come back
whole across chunks for the owning project only and never past its retention; a batch line is claimed by one holder
at a time, finished only by its holder, handed back when its holder is gone; output files and the final status are
written together or not at all; purges per project and by time."""

from __future__ import annotations

import threading

from llmgw.store import BatchLine, BatchRecord, FileRecord, open_store
from llmgw.store.files import CHUNK_BYTES


def _file(file_id: str, project: str, data: bytes, created: float = 1000.0, kept: float = 100.0,
          purpose: str = "batch") -> FileRecord:
    return FileRecord(file_id, project, purpose, "in.jsonl", len(data), created, created + kept)


def _batch(batch_id: str, project: str = "chat", created: float = 1000.0) -> BatchRecord:
    return BatchRecord(batch_id, project, "key_1", "in_progress", created, created + 100.0,
                       {"endpoint": "/v1/chat/completions", "input_file_id": "file-1"})


def test_a_file_of_several_chunks_comes_back_whole_for_its_project_only_until_it_expires(store):
    data = bytes(range(256)) * (CHUNK_BYTES // 256) + b"tail \x00 \xff"
    store.save_file(_file("file-a", "chat", data), data)
    assert store.file_content("file-a", "chat", now=1050.0) == data
    assert store.file_record("file-a", "chat", now=1050.0).bytes == len(data)
    assert store.file_content("file-a", "other", now=1050.0) is None
    assert store.file_record("file-a", "chat", now=1100.0) is None  # expired, even before a purge
    assert store.delete_file("file-a", "other") is False and store.delete_file("file-a", "chat") is True
    assert store.file_content("file-a", "chat", now=1050.0) is None


def test_files_are_listed_by_project_and_purpose_page_by_page(store):
    for index in range(5):
        store.save_file(_file(f"file-{index}", "chat", b"x", created=1000.0 + index,
                              purpose="batch" if index % 2 == 0 else "batch_output"), b"x")
    store.save_file(_file("file-team", "team", b"x"), b"x")
    listed = store.list_files("chat", now=1010.0)
    assert [f.id for f in listed] == ["file-4", "file-3", "file-2", "file-1", "file-0"]
    assert [f.id for f in store.list_files("chat", purpose="batch", now=1010.0)] == ["file-4", "file-2", "file-0"]
    assert [f.id for f in store.list_files("chat", after="file-3", limit=2, now=1010.0)] == ["file-2", "file-1"]
    assert [f.id for f in store.list_files("chat", newest_first=False, limit=2, now=1010.0)] == ["file-0", "file-1"]


def test_each_line_is_claimed_once_finished_by_its_holder_and_handed_back_when_its_holder_is_gone(store):
    lines = [BatchLine(i, f"c{i}", f'{{"n": {i}}}') for i in range(3)]
    store.create_batch(_batch("batch_a"), lines)
    first = store.claim_batch_line("batch_a", "plane-1", now=1001.0)
    second = store.claim_batch_line("batch_a", "plane-1", now=1001.0)
    assert (first.line, second.line) == (0, 1) and first.custom_id == "c0"
    assert store.finish_batch_line("batch_a", 0, "plane-2", True, "{}") is False  # not its line
    assert store.finish_batch_line("batch_a", 0, "plane-1", True, '{"ok": 0}') is True
    assert store.finish_batch_line("batch_a", 0, "plane-1", True, '{"again": 0}') is False  # finished once
    counts = store.batch("batch_a", "chat", now=1002.0).counts
    assert (counts.total, counts.completed, counts.failed, counts.running, counts.pending) == (3, 1, 0, 1, 1)
    assert second.sent_to is None and store.send_batch_line("batch_a", 1, "plane-2", "tiny-1") is False  # not its
    assert store.send_batch_line("batch_a", 1, "plane-1", "tiny-0") is True  # sent to tiny-0, then plane-1 is killed
    assert store.requeue_batch_lines("batch_a", "plane-2") == 1  # plane-1 is gone: its running line 1 comes back
    assert store.finish_batch_line("batch_a", 1, "plane-1", True, "{}") is False  # its late result is dropped
    assert store.send_batch_line("batch_a", 1, "plane-1", "tiny-0") is False  # nor sent again by it
    claimed = [store.claim_batch_line("batch_a", "plane-2", now=1003.0) for _ in range(3)]
    assert [c.line if c else None for c in claimed] == [1, 2, None]
    assert [c.sent_to for c in claimed[:2]] == ["tiny-0", None]  # line 1 goes back where its answer is kept
    store.finish_batch_line("batch_a", 2, "plane-2", False, '{"error": 2}')
    store.finish_batch_line("batch_a", 1, "plane-2", True, '{"ok": 1}')
    assert [(r.line, r.state, r.result) for r in store.batch_results("batch_a")] == [
        (0, "completed", '{"ok": 0}'), (1, "completed", '{"ok": 1}'), (2, "failed", '{"error": 2}')]


def test_two_holders_claiming_at_once_never_get_the_same_line(store_url):
    stores = [open_store(store_url) for _ in range(2)]
    try:
        stores[0].create_batch(_batch("batch_b"), [BatchLine(i, None, "{}") for i in range(40)])
        got: dict[str, list[int]] = {"p0": [], "p1": []}

        def claim_all(index: int) -> None:
            while (line := stores[index].claim_batch_line("batch_b", f"p{index}", now=1001.0)) is not None:
                got[f"p{index}"].append(line.line)

        threads = [threading.Thread(target=claim_all, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(got["p0"] + got["p1"]) == list(range(40))
    finally:
        for opened in stores:
            opened.close()


def test_the_final_status_and_the_output_files_are_written_together_once(store):
    store.create_batch(_batch("batch_c"), [BatchLine(0, "c0", "{}")])
    output = _file("file-out", "chat", b'{"custom_id": "c0"}\n', purpose="batch_output")
    assert store.update_batch("batch_c", ("in_progress",), "completed", {"output_file_id": "file-out"},
                              [(output, b'{"custom_id": "c0"}\n')]) is True
    again = _file("file-again", "chat", b"", purpose="batch_output")
    assert store.update_batch("batch_c", ("in_progress",), "completed", {}, [(again, b"")]) is False
    assert store.file_record("file-again", "chat", now=1001.0) is None
    done = store.batch("batch_c", now=1001.0)
    assert done.status == "completed" and done.body == {"output_file_id": "file-out"}
    assert store.active_batches() == []


def test_purges_take_expired_files_and_batches_and_everything_of_a_project(store):
    store.save_file(_file("file-old", "chat", b"a", kept=10.0), b"a")
    store.save_file(_file("file-new", "chat", b"b", kept=1000.0), b"b")
    store.save_file(_file("file-team", "team", b"c", kept=1000.0), b"c")
    store.create_batch(_batch("batch_old"), [BatchLine(0, None, "{}")])
    store.create_batch(_batch("batch_team", "team"), [BatchLine(0, None, "{}")])
    assert store.purge_files(now=1500.0) == 1 and store.purge_batches(now=1050.0) == 0
    assert store.purge_batches(now=1500.0) == 2
    assert store.purge_files(project="chat") == 1
    assert store.file_content("file-team", "team", now=1500.0) == b"c"

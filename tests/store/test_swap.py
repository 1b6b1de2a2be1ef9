"""`Store.swap`: a value is written only over the one the writer read, so two writers racing for a key (node
identities recorded on first use, `llmgw.control.node_identity`) never both win; on both backends."""

from __future__ import annotations

from llmgw.store import Store


def test_swap_writes_only_over_the_value_read(store: Store) -> None:
    assert store.swap("k", None, "first")
    assert not store.swap("k", None, "second")  # someone wrote it since: read again
    assert store.get("k") == "first"
    assert not store.swap("k", "stale", "third") and store.get("k") == "first"
    assert store.swap("k", "first", "") and store.get("k") == ""
    assert store.swap("k", "", "again") and store.get("k") == "again"

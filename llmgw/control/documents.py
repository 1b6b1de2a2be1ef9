"""The status document, rebuilt in proportion to what changed: `StatusDocuments`.

    documents = StatusDocuments()
    doc = documents.build(state.watch, state.fleet, state.last_pass, state.last_plan, failures)
    # == status_document(state.watch, state.fleet.records(), state.last_pass, state.last_plan, failures)

The control plane builds the status document after every pass (the audit's snapshot) and for every
`GET /api/v1/status`. Built from scratch it costs about 1.6 ms of CPU per node here, all of it on the trio loop:
at 2,000 agents the timer pass every 10 s held the loop 1-3 s just for that (`LLMGW_STALL_MS`, docs/scale.md), the
heartbeats' p99 with it. `StatusDocuments` keeps each node's entry and reuses it while the record's fields the entry
reads are equal (`llmgw.control.audit.node_document_key`; a readings-only heartbeat changes none of them), and the
`replicas` section while the registry's `revision` (on its `line`) and the plan are the same objects as before
(every change of a shard, a node's loss or registration moves the revision). The rest of the document is small.

The document is exactly `status_document`'s (tests/control/test_status_documents.py, on seeded random sequences of
registry transitions). Its entries are shared between documents: nobody may change a document it got.
"""

from __future__ import annotations

import threading
from typing import Any

from llmgw.control.audit import node_document, node_document_key, replica_documents, status_document
from llmgw.control.registry import FleetRegistry, NodeRecord
from llmgw.control.state import PassRecord, WatchState
from llmgw.plan.types import Plan


class StatusDocuments:
    """Builds status documents, reusing unchanged node entries and an unchanged `replicas` section (see the module).

    Thread-safe: the trio loop builds one after each pass, the admin API in a worker thread (`build` holds a lock).
    `built` / `reused` count the node entries built and reused.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[NodeRecord, tuple, dict[str, Any]]] = {}
        self._replicas: tuple[object, int, Plan | None, dict[str, Any]] | None = None
        self.built = 0
        self.reused = 0

    def node(self, record: NodeRecord) -> dict[str, Any]:
        """`node_document(record)`, the previous one for this node while what it reads is equal."""
        kept = self._nodes.get(record.node_id)
        if kept is not None and kept[0] is record:
            self.reused += 1
            return kept[2]
        key = node_document_key(record)
        if kept is not None and kept[1] == key:
            self._nodes[record.node_id] = (record, key, kept[2])
            self.reused += 1
            return kept[2]
        doc = node_document(record)
        self._nodes[record.node_id] = (record, key, doc)
        self.built += 1
        return doc

    def replicas(self, fleet: FleetRegistry, records: tuple[NodeRecord, ...], plan: Plan | None) -> dict[str, Any]:
        """`replica_documents(records, plan)`; the previous section while `fleet`'s line and revision and `plan`
        are the ones it was built from."""
        kept = self._replicas
        if kept is not None and kept[0] is fleet.line and kept[1] == fleet.revision and kept[2] is plan:
            return kept[3]
        doc = replica_documents(records, plan)
        self._replicas = (fleet.line, fleet.revision, plan, doc)
        return doc

    def build(self, watch: WatchState, fleet: FleetRegistry, last_pass: PassRecord | None, plan: Plan | None,
              failures: list[dict[str, Any]] = (),  # type: ignore[assignment]
              ) -> dict[str, Any]:
        """The status document of these parts (`llmgw.control.audit.status_document`); a new top-level dict whose
        `nodes` and `replicas` entries may be shared with earlier documents (never change them)."""
        with self._lock:
            return self._build(watch, fleet, last_pass, plan, failures)

    def _build(self, watch: WatchState, fleet: FleetRegistry, last_pass: PassRecord | None, plan: Plan | None,
               failures: list[dict[str, Any]]) -> dict[str, Any]:
        records = fleet.records()
        if len(self._nodes) > len(records):  # a registry rebuilt without some node (a new line): forget it
            ids = {r.node_id for r in records}
            self._nodes = {k: v for k, v in self._nodes.items() if k in ids}
        return status_document(watch, records, last_pass, plan, failures,
                               nodes={r.node_id: self.node(r) for r in records},
                               replicas=self.replicas(fleet, records, plan))

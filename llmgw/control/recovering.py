"""A control plane started again learns its fleet back: until the agents it knew have reconnected, it says so.

A control plane knows its fleet only from the agents connected to it. Started again (after a crash, `llmgw restart`,
an upgrade), it has none until they reconnect (within their reconnect backoff, `llmgw.agent.runtime`), and its
gateway meanwhile knows no replica. So the leader keeps the ids of the nodes connected to it in the store (key
`KNOWN_NODES_KEY` of the store's key/value table, a JSON list, written when the set changes), shared by every
control plane on that store; at start a control plane reads that list, and until every node in it has reconnected,
or `grace` seconds have passed, it is *recovering*: the gateway's `/health` answers 503 with
`{"status": "recovering", "fleet": "recovering: 1 of 2 known nodes reconnected"}` (so haproxy sends it nothing
yet), and the admin API's health and `llmgw status` say the same. Once recovered it stays so (a node lost later is
the fleet's business, not the control plane's health).

`recovery` is pure: it takes the known ids, the connected ids, and times on one clock (the control plane's trio
clock), and returns a `Recovery`. The countdown itself is part of `ControlState` (`state.Recovering`: the known ids,
the start and the grace, and the Recovery once a pass found it done).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass

KNOWN_NODES_KEY = "control-plane/known-nodes"
"""The store key/value entry holding the JSON list of node ids connected to the leader."""
DEFAULT_GRACE = 20.0
"""Seconds a control plane waits at most for its known nodes (agents retry every 5 s at most: four tries each)."""


@dataclass(frozen=True)
class Recovery:
    """Where a control plane stands in learning its fleet back.

    `done`: every known node reconnected, or the grace period is over. `known`/`reconnected`: how many nodes the store
    named at start, and how many of those are connected now. `text`: one line for people ("ready", "recovering: 1 of
    2 known nodes reconnected (at most 12 s more)", "ready (1 of 2 known nodes did not reconnect within 20 s:
    n2)").
    """

    done: bool
    known: int
    reconnected: int
    text: str


def recovery(known: Collection[str], connected: Collection[str], started: float, now: float,
             grace: float = DEFAULT_GRACE) -> Recovery:
    """Whether the fleet `known` at start (node ids) is back: `connected` ids now; `started`, `now` and `grace` in
    seconds on one clock. Pure."""
    back = [node for node in known if node in connected]
    missing = sorted(set(known) - set(back))
    if not missing:
        return Recovery(True, len(known), len(back), "ready")
    left = started + grace - now
    if left <= 0:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        return Recovery(True, len(known), len(back), f"ready ({len(missing)} of {len(known)} known nodes did not "
                                                     f"reconnect within {grace:g} s: {shown})")
    return Recovery(False, len(known), len(back), f"recovering: {len(back)} of {len(known)} known nodes "
                                                  f"reconnected (at most {left:.0f} s more)")


def encode_known(node_ids: Collection[str]) -> str:
    """The value stored under KNOWN_NODES_KEY: the sorted ids as a JSON list."""
    return json.dumps(sorted(node_ids))


def decode_known(value: str | None) -> frozenset[str]:
    """The ids stored under KNOWN_NODES_KEY (empty when absent or not a JSON list of strings: nothing to wait for)."""
    try:
        ids = json.loads(value) if value else []
    except ValueError:
        return frozenset()
    return frozenset(i for i in ids if isinstance(i, str)) if isinstance(ids, list) else frozenset()

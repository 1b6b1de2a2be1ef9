"""`Tallies`: the control loop's running counts, part of `ControlState` so that readers (metrics) see them in the
same immutable snapshot as everything else.

Pure values. Counted since the control plane started (Prometheus counters: they start again at 0 after a restart,
which `rate()` handles):
- reconcile passes by outcome ("converged" when the fleet matched the settings commit after the pass, else
  "not_converged"), and how long deciding each pass took (seconds, a histogram over `PASS_SECONDS_BUCKETS`);
- actions by kind (`ActionKind` values: start, stop, install, restart, configure) and outcome: "sent" when a pass
  sends its command, "succeeded" / "failed" when the node answers (a timeout or a broken stream is "failed").

The control loop (`llmgw.control.looping`) counts a pass with `counted_pass` right after `decide`, and an action's
answer with `counted_outcome` inside the same transition that records it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

PASS_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Upper bounds (seconds) of the pass-duration histogram's buckets; +Inf is implied."""

PASS_OUTCOMES = ("converged", "not_converged")
ACTION_OUTCOMES = ("sent", "succeeded", "failed")


def _frozen(mapping: Mapping | None = None) -> Mapping:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Tallies:
    """Running counts of the control loop.

    `passes`: outcome -> passes. `pass_seconds_sum`: seconds spent deciding, all passes. `pass_seconds_buckets`:
    passes per bucket of `PASS_SECONDS_BUCKETS` plus one for +Inf (not cumulative). `actions`: (kind, outcome)
    -> count.
    """

    passes: Mapping[str, int] = field(default_factory=_frozen)
    pass_seconds_sum: float = 0.0
    pass_seconds_buckets: tuple[int, ...] = (0,) * (len(PASS_SECONDS_BUCKETS) + 1)
    actions: Mapping[tuple[str, str], int] = field(default_factory=_frozen)

    @property
    def pass_count(self) -> int:
        """Every pass counted."""
        return sum(self.passes.values())

    def cumulative_buckets(self) -> list[tuple[float, int]]:
        """(upper bound seconds, passes at or under it) for each bucket, the last bound being +inf."""
        out, total = [], 0
        for bound, count in zip((*PASS_SECONDS_BUCKETS, float("inf")), self.pass_seconds_buckets):
            total += count
            out.append((bound, total))
        return out

    def counted_pass(self, converged: bool, seconds: float, sent_kinds: tuple[str, ...]) -> Tallies:
        """These tallies with one more pass: its outcome, its duration (`seconds` >= 0) and the kinds of the
        actions it sent (one entry per action)."""
        outcome = "converged" if converged else "not_converged"
        buckets = list(self.pass_seconds_buckets)
        buckets[bisect_left(PASS_SECONDS_BUCKETS, seconds)] += 1
        actions = dict(self.actions)
        for kind in sent_kinds:
            actions[(kind, "sent")] = actions.get((kind, "sent"), 0) + 1
        return replace(
            self, passes=_frozen({**self.passes, outcome: self.passes.get(outcome, 0) + 1}),
            pass_seconds_sum=self.pass_seconds_sum + max(0.0, seconds), pass_seconds_buckets=tuple(buckets),
            actions=_frozen(actions),
        )

    def counted_outcome(self, kind: str, outcome: str) -> Tallies:
        """These tallies with one more answered action of `kind` ("succeeded" or "failed")."""
        key = (kind, outcome)
        return replace(self, actions=_frozen({**self.actions, key: self.actions.get(key, 0) + 1}))

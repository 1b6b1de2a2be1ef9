"""Long trio task steps: which task held the control plane's trio loop, for how long, and where.

    trio.run(main, instruments=[StallRecorder(threshold=0.05)])   # or LLMGW_STALL_MS=50 for `llmgw server`

A trio loop runs one task step at a time; a step that runs 2 s delays every timer (the leader lease's renewal
among them) by 2 s. `StallRecorder` is a trio Instrument: `before_task_step`/`after_task_step` time each step on the
loop's thread; a watchdog thread samples the loop thread's Python stack (`sys._current_frames`) once a step has run
`threshold` seconds, so the record says where the step was while it was long, not only which task it was. Each
step longer than `threshold` is logged (logger `llmgw.stalls`, WARNING) with its task, seconds and stack sample,
and kept in `stalls` (the latest `keep`).

Diagnostic only: the watchdog wakes every `threshold / 2` seconds; nothing here changes what the loop does.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass

import trio

log = logging.getLogger("llmgw.stalls")

ENV = "LLMGW_STALL_MS"
"""Environment variable: `llmgw server` records task steps longer than this many milliseconds (unset: off)."""


@dataclass(frozen=True)
class Stall:
    """One long task step: the task's name, its seconds (wall clock), when it ended (time.time()), and the loop
    thread's stack sampled while it ran (innermost frame last; empty when the step ended before the sample)."""

    task: str
    seconds: float
    ended: float
    stack: tuple[str, ...]


class StallRecorder(trio.abc.Instrument):
    """Records trio task steps longer than `threshold` seconds (see the module docstring)."""

    def __init__(self, threshold: float = 0.05, keep: int = 1000):
        self.threshold = threshold
        self.stalls: deque[Stall] = deque(maxlen=keep)
        self._step: tuple[int, float] | None = None  # (step number, perf_counter at its start) while one runs
        self._number = 0
        self._sample: tuple[int, tuple[str, ...]] | None = None
        self._thread_id = 0
        self._stop = threading.Event()

    def before_run(self) -> None:
        self._thread_id = threading.get_ident()
        threading.Thread(target=self._watch, name="llmgw-stall-watch", daemon=True).start()

    def after_run(self) -> None:
        self._stop.set()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._number += 1
        self._step = (self._number, time.perf_counter())

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        step, self._step = self._step, None
        if step is None:
            return
        seconds = time.perf_counter() - step[1]
        if seconds < self.threshold:
            return
        sample = self._sample
        stack = sample[1] if sample is not None and sample[0] == step[0] else ()
        stall = Stall(task.name, seconds, time.time(), stack)
        self.stalls.append(stall)
        log.warning("trio task %s ran %.0f ms without yielding; sampled at:\n%s", task.name, seconds * 1000,
                    "\n".join(stack) or "  (not sampled)")

    def _watch(self) -> None:
        while not self._stop.wait(self.threshold / 2):
            step = self._step
            if step is None or time.perf_counter() - step[1] < self.threshold:
                continue
            if self._sample is not None and self._sample[0] == step[0]:
                continue  # one sample per step: the first, taken once it was long
            frame = sys._current_frames().get(self._thread_id)
            if frame is not None:
                lines = traceback.format_stack(frame, limit=12)
                self._sample = (step[0], tuple(line.rstrip() for line in lines))


def from_environment() -> list[trio.abc.Instrument]:
    """`[StallRecorder]` when LLMGW_STALL_MS is set to a positive number of milliseconds, else `[]`."""
    value = os.environ.get(ENV, "")
    try:
        ms = float(value)
    except ValueError:
        return []
    return [StallRecorder(threshold=ms / 1000)] if ms > 0 else []

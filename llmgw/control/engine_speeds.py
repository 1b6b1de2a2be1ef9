"""Each shard's prefill and decode speed from its engine's own counters, reading after reading (pure).

The agents carry each ready shard's `EngineLoad` in every heartbeat (`llmgw.agent.engine_load`): counters of the
seconds the engine spent on prefill and on decode and of the tokens it did in them. Between two readings of one
shard:

    prefill tokens/s = Δ prefill_tokens_total / Δ prefill_seconds_total
    decode tokens/s  = (Δ decode_tokens_total - Δ decode_requests_total) / Δ decode_seconds_total  x  batch
    batch            = requests decoding at once, per engine step, at least 1:
                       llama-server Δ(busy_slots_per_step x steps_total) / Δ steps_total,
                       vLLM Δ generation_tokens_total / Δ steps_total (one token per running request and step)

Each request's first token comes out of its prefill, so it is taken off the decode tokens where the engine counts
its requests (vLLM; llama-server does not, and its figure keeps them in, as its own `predicted_per_second` does).
The decode seconds are summed over the requests in flight, so tokens over seconds is what one request got; times
the batch it is the whole replica's, as `ReplicaSpeed` and `llmgw bench` (per request x concurrency) mean it: 8
requests decoding at once at 40 tokens/s each make 320. Prefill: llama-server's prompt seconds are its own wall
time of prompt batches, so its figure is the whole engine's; vLLM's are summed over requests like its decode
seconds, so its figure is what one request's prompt got (no batch is applied: prompts share steps with decodes).

A phase in which no tokens were done between the two readings (or no time passed) gives no new figure: its last
one stays, with the time it was measured. A counter lower than before means the engine restarted: the reading's
own values are then what was done since the restart (as Prometheus' `rate()` takes them). An engine without the
counters (SGLang, an older llama-server) has no figure; one without step counters gets a batch of 1.

Precision: llama-server prints its counters with 6 significant digits (C++'s default stream precision: 12345678
tokens read "1.23457e+07"), so after a long run a few seconds' growth is lost in the last digit. A phase's figure
is taken only once its tokens and seconds each grew by at least `PRECISION_DIGITS` times the last printed digit of
their counters (1 % at worst), and the decode batch's steps and busy slots likewise; until then each phase keeps
the reading it is measured from (`prefill_from`, `decode_from`) and the growth adds up over the next readings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from llmgw.routes import ReplicaSpeed
from llmgw.tools.engine_metrics import EngineLoad

SOURCE = "metrics"
PRECISION_DIGITS = 100
"""How many of its counter's last printed digit (6 significant digits) a phase's growth must be for a figure."""

_COUNTERS = ("prefill_seconds_total", "prefill_tokens_total", "decode_seconds_total", "decode_tokens_total",
             "decode_requests_total", "steps_total", "generation_tokens_total")


@dataclass(frozen=True)
class MeasuredSpeed:
    """One shard's speed from its engine's counters.

    `load` and `at` (unix seconds at the agent): the last reading (a restart is judged against it).
    `prefill_from` / `decode_from`: the reading each phase's next figure is measured from (None: the engine's
    start, after a restart). `prefill_tokens_per_second` / `decode_tokens_per_second` (None: never measured) and
    `prefill_at` / `decode_at` (unix seconds of the reading that measured each; 0.0: never).
    """

    load: EngineLoad
    at: float
    prefill_from: EngineLoad | None = None
    decode_from: EngineLoad | None = None
    prefill_tokens_per_second: float | None = None
    prefill_at: float = 0.0
    decode_tokens_per_second: float | None = None
    decode_at: float = 0.0

    def replica_speed(self) -> ReplicaSpeed | None:
        """The figures as the routing table carries them (`source` "metrics", `measured_at` the older of the two
        phases' times, `slots` 0: unknown), or None until both phases have one."""
        if not self.prefill_tokens_per_second or not self.decode_tokens_per_second:
            return None
        return ReplicaSpeed(prefill_tokens_per_second=self.prefill_tokens_per_second,
                            decode_tokens_per_second=self.decode_tokens_per_second,
                            measured_at=min(self.prefill_at, self.decode_at), source=SOURCE)


def _reset(before: EngineLoad, now: EngineLoad) -> bool:
    """Whether a counter went down between the two readings (the engine restarted)."""
    for name in _COUNTERS:
        old, new = getattr(before, name), getattr(now, name)
        if old is not None and new is not None and new < old:
            return True
    return False


def _done(before: EngineLoad | None, now: EngineLoad, name: str) -> float | None:
    """How much counter `name` grew from `before` (None: since the engine started) to `now`; None when `now` does
    not have it."""
    new = getattr(now, name)
    if new is None:
        return None
    old = getattr(before, name) if before is not None else None
    return new - (old or 0.0)


def decode_batch(before: EngineLoad | None, now: EngineLoad) -> float:
    """The requests the engine decoded at once, per step, between `before` (None: since it started) and `now`; at
    least 1, and 1 when the engine does not say (see the module docstring)."""
    steps = _done(before, now, "steps_total")
    if not steps or steps <= 0:
        return 1.0
    if now.busy_slots_per_step is not None and now.steps_total is not None:
        old = (before.busy_slots_per_step or 0.0) * (before.steps_total or 0.0) if before is not None else 0.0
        running = now.busy_slots_per_step * now.steps_total - old
    else:
        running = _done(before, now, "generation_tokens_total") or 0.0
    return max(1.0, running / steps)


def _digit(value: float) -> float:
    """The last digit of `value` printed with 6 significant digits (0.0 for 0)."""
    return 10.0 ** (math.floor(math.log10(abs(value))) - 5) if value else 0.0


def _precise(before: EngineLoad | None, now: EngineLoad, *names: str) -> bool:
    """Whether each counter of `names` grew by at least `PRECISION_DIGITS` of its last printed digit."""
    for name in names:
        value, grown = getattr(now, name), _done(before, now, name)
        if value is None or grown is None or value <= 0:
            return False
        if grown < PRECISION_DIGITS * _digit(value):
            return False
    return True


def _batch_precise(before: EngineLoad | None, now: EngineLoad) -> bool:
    """Whether `decode_batch` is 1 % precise: the steps grew by `PRECISION_DIGITS` of their last printed digit,
    and the busy slots (llama-server: a product of two printed values, whose rounding adds up) or the generated
    tokens (vLLM) likewise. True when the engine counts no steps (its batch is 1)."""
    steps = _done(before, now, "steps_total")
    if steps is None:
        return True
    if not _precise(before, now, "steps_total"):
        return False
    if now.busy_slots_per_step is None:
        return _precise(before, now, "generation_tokens_total")
    error = 0.0
    for load in (before, now):
        if load is not None and load.steps_total and load.busy_slots_per_step is not None:
            error += (load.busy_slots_per_step * _digit(load.steps_total)
                      + load.steps_total * _digit(load.busy_slots_per_step))
    return decode_batch(before, now) * steps >= PRECISION_DIGITS * error


def _phase(before: EngineLoad | None, load: EngineLoad, tokens_name: str, seconds_name: str,
           first_tokens: str | None = None, ready: bool = True) -> tuple[float | None, bool]:
    """(tokens per second of one phase from `before` to `load`, or None; whether `load` becomes the phase's
    reading to measure from): a figure when tokens were done, time passed and both grew precisely enough (and
    `ready`: what else the figure needs is); the reading moves on with a figure, or when no tokens were done (or
    the engine does not say); else it stays."""
    tokens, seconds = _done(before, load, tokens_name), _done(before, load, seconds_name)
    if tokens is None or seconds is None:
        return None, True
    if first_tokens is not None:
        tokens -= _done(before, load, first_tokens) or 0.0
    if tokens <= 0:
        return None, True
    if seconds <= 0 or not ready or not _precise(before, load, tokens_name, seconds_name):
        return None, False
    return tokens / seconds, True


def next_speed(previous: MeasuredSpeed | None, load: EngineLoad, at: float) -> MeasuredSpeed:
    """The shard's speed after its reading `load`, taken at `at` (unix seconds), given its speed before
    (`previous`; None: first reading, which only becomes the reading to measure from). See the module docstring
    for the rules."""
    if previous is None:
        return MeasuredSpeed(load=load, at=at, prefill_from=load, decode_from=load)
    restarted = _reset(previous.load, load)
    prefill_from = None if restarted else previous.prefill_from
    decode_from = None if restarted else previous.decode_from
    speed = replace(previous, load=load, at=at, prefill_from=prefill_from, decode_from=decode_from)
    prefill, moves = _phase(prefill_from, load, "prefill_tokens_total", "prefill_seconds_total")
    if moves:
        speed = replace(speed, prefill_from=load)
    if prefill is not None:
        speed = replace(speed, prefill_tokens_per_second=prefill, prefill_at=at)
    decode, moves = _phase(decode_from, load, "decode_tokens_total", "decode_seconds_total", "decode_requests_total",
                           _batch_precise(decode_from, load))
    if moves:
        speed = replace(speed, decode_from=load)
    if decode is not None:
        speed = replace(speed, decode_tokens_per_second=decode * decode_batch(decode_from, load), decode_at=at)
    return speed


def next_node_speeds(speeds: Mapping[str, MeasuredSpeed], loads: Mapping[str, EngineLoad], at: float,
                     shards: Iterable[str]) -> dict[str, MeasuredSpeed]:
    """A node's speeds by shard id after one reading: each shard of `loads` (its engine's reading, taken at `at`)
    goes through `next_speed`; a shard not read this time keeps what it had; shards not in `shards` (the node's
    shard ids now) are dropped."""
    out: dict[str, MeasuredSpeed] = {}
    for shard_id in shards:
        load = loads.get(shard_id)
        kept = speeds.get(shard_id)
        if load is not None:
            out[shard_id] = next_speed(kept, load, at)
        elif kept is not None:
            out[shard_id] = kept
    return out

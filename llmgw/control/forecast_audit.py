"""The forecast of a reviewed change, checked once the change ran, and the error written into the audit. Pure.

`llmgw apply --review REVIEW.json` hands the control plane the review's plan and its forecast (`ReviewedPlan`,
`ControlState.reviewed`). The check is runtime state (`ControlState.forecast_audit`, forgotten by a restart, as the
reviewed plan is):

- `watch_forecast` (each pass, leader, over the state the pass produced): the first pass that finds the fleet
  converged to the reviewed commit starts the window: `reconcile.forecast_check_after` seconds later (a timer wakes that
  pass) the load is measured (`MeasureForecast`).
- The handler reads the store's usage records since the change converged and turns them into a `RecordedLoad`
  (`llmgw.control.load_record.recorded_load`, what `GET /api/v1/fleet` and so `llmgw forecast-check` read) and the
  checks (`llmgw.plan.forecast_check.check_forecast`, `measure_forecast` here); `forecast_measured` takes them in.
  A store that fails: `forecast_unmeasured`, measured again a tenth of the window later (at least 1 s).
- The pass that follows writes an audit commit (status.yaml `forecast_check:` changed) whose message has one line
  per model with the forecast, the measured figure and the error (`forecast_lines`). The check is made once per
  reviewed commit; a later `apply --review` of another commit starts another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from llmgw.control.effects import Effect, MeasureForecast
from llmgw.control.load_record import recorded_load
from llmgw.control.state import ControlState, ForecastAudit
from llmgw.plan.forecast_check import ForecastCheck, check_forecast
from llmgw.routes import ReplicaSpeed
from llmgw.store import UsageLoad

MIN_RECHECK = 1.0
"""Seconds, at least, before a measurement that could not read the store is tried again."""


def watch_forecast(state: ControlState, now: float, now_unix: float) -> tuple[ControlState, list[Effect]]:
    """(Leader, each pass at `now`, control-plane clock, over the state it produced, its record in `last_pass`;
    `now_unix` the same moment in unix seconds.) Starts the
    window of a reviewed commit with a forecast once a pass found the fleet converged to it, and asks for the
    measurement (`MeasureForecast`) once the window passed. Returns the next state (`state` itself when nothing
    changed) and the effects."""
    reviewed, audit, settings = state.reviewed, state.forecast_audit, state.settings
    if reviewed is None or not reviewed.forecast or settings is None:
        return state, []
    if audit is None or audit.commit != reviewed.commit:
        last = state.last_pass
        if last is None or not last.converged or last.settings_commit != reviewed.commit:
            return state, []
        due = now + settings.cluster.forecast_check_after
        audit = ForecastAudit(reviewed.commit, reviewed.forecast, now, now_unix, due)
        state = replace(state, forecast_audit=audit,
                        timers=(*state.timers, (due, f"forecast of {reviewed.commit[:12]} due")))
    if audit.checks is not None or audit.measuring or now < audit.check_at:
        return state, []
    return (replace(state, forecast_audit=replace(audit, measuring=True)),
            [MeasureForecast(audit.commit, audit.forecast, audit.converged_at_unix, now_unix)])


def measure_forecast(forecast: tuple[Mapping[str, Any], ...], usage: UsageLoad, speeds: Mapping[str, ReplicaSpeed],
                     since_unix: float, now_unix: float, until: str) -> tuple[tuple[ForecastCheck, ...], float]:
    """The checks of `forecast` against `usage` (the store's `usage_load` since `since_unix`) as `llmgw
    forecast-check` makes them, and the window measured (seconds, `now_unix - since_unix`)."""
    window = max(0.0, now_unix - since_unix)
    return check_forecast(list(forecast), recorded_load(usage, speeds, window, until)), window


def forecast_measured(commit: str, checks: tuple[ForecastCheck, ...], window: float, until: str):
    """The transition of `MeasureForecast`'s answer: the `checks` of reviewed commit `commit` over `window` seconds
    up to `until`. A pass follows (its audit commit carries them)."""

    def transition(state: ControlState) -> tuple[ControlState, bool]:
        audit = state.forecast_audit
        if audit is None or audit.commit != commit or not audit.measuring:
            return state, False
        done = replace(audit, measuring=False, checks=checks, window=window, until=until, error="")
        return replace(state, forecast_audit=done), True

    return transition


def forecast_unmeasured(commit: str, error: str):
    """The transition of a `MeasureForecast` that could not read the usage records (`error`): measured again a
    tenth of the window later."""

    def transition(state: ControlState) -> tuple[ControlState, bool]:
        audit = state.forecast_audit
        if audit is None or audit.commit != commit or not audit.measuring:
            return state, False
        settings = state.settings
        after = settings.cluster.forecast_check_after if settings is not None else 0.0
        due = audit.check_at + max(MIN_RECHECK, after / 10)
        return replace(state, forecast_audit=replace(audit, measuring=False, check_at=due, error=error),
                       timers=(*state.timers, (due, f"forecast of {commit[:12]} measured again"))), False

    return transition


def _error(value: float | None) -> str:
    return "unknown" if value is None else f"{value:+.0%}"


def _figure(value: float | None, unit: str) -> str:
    return "unknown" if value is None else f"{value:.3g}{unit}"


def check_line(check: ForecastCheck) -> str:
    """One model's check, for people: the error of completion tokens/s and TTFT p90, and how far the traffic moved."""
    return (f"{check.model}: completion tokens/s forecast {_figure(check.tokens_forecast, '')}, measured "
            f"{_figure(check.tokens_measured, '')} (error {_error(check.tokens_error)}); TTFT p90 forecast "
            f"{_figure(check.ttft_p90_forecast, ' s')}, measured {_figure(check.ttft_p90_measured, ' s')} (error "
            f"{_error(check.ttft_p90_error)}); requests/s forecast {_figure(check.rate_forecast, '')}, measured "
            f"{_figure(check.rate_measured, '')} (traffic moved {_error(check.rate_error)}; {check.requests} requests)")


def forecast_lines(audit: ForecastAudit | None) -> list[str]:
    """The audit commit message's section on the forecast's check: a list item, with an item per model under it;
    empty before it was measured."""
    if audit is None or audit.checks is None:
        return []
    head = (f"- forecast of reviewed {audit.commit[:12]} checked over the {audit.window:.0f} s up to {audit.until} "
            f"(error: measured / forecast - 1):")
    return [head, *(f"  - {check_line(c)}" for c in audit.checks)] if audit.checks else [
        f"{head} the review forecast no model"]


def forecast_status(audit: ForecastAudit) -> dict[str, Any]:
    """The check as status.yaml holds it (`forecast_check:`): the commit, the window, and each model's figures
    (`ForecastCheck.to_json`), or `waiting` until measured."""
    return {"commit": audit.commit, "converged_at_unix": audit.converged_at_unix,
            "state": "waiting" if audit.checks is None else "measured", "window_seconds": audit.window or None,
            "until": audit.until or None, "error": audit.error or None,
            "models": [c.to_json() for c in audit.checks or ()]}

"""Settings the control plane reads only when it starts, seen to differ from what runs.

A commit that changes `listeners.gateway.workers` (or another key of `llmgw.settings.RESTART_ONLY`: the listeners'
addresses, the store, the control plane's tracing) is applied like any other, but the processes and sockets it
describes stay as they were started until the control plane starts again (`llmgw restart`). `restart_notes`
says so, one sentence per such key; the control plane logs each as a warning once and lists them among the status
notes (`llmgw status`). Keys given on the command line (`llmgw server --gateway-workers`, `--gateway`, `--store`,
...) win over the settings at every start, so a change of theirs is no note. Pure.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from llmgw.gateway import worker_count
from llmgw.settings import ClusterSettings, restart_only_changes


def _overridden(path: str, overridden: Collection[str]) -> bool:
    return any(path == key or path.startswith(key + ".") for key in overridden)


def restart_notes(running: ClusterSettings, overridden: Collection[str], settings: ClusterSettings) -> tuple[str, ...]:
    """One sentence per restart-only key whose value in `settings` (those in force) differs from what runs:
    `running` is the cluster the control plane started with, its `gateway.workers` the number of gateway processes
    that run (an int); `overridden` the llmgw.yaml paths set on the command line instead ("store",
    "listeners.gateway.workers", ...), left out. "auto" workers count as the CPU count (`worker_count`). The same
    difference gives the same sentence whatever commit carries it. Empty when everything runs as the settings say."""
    wanted = replace(settings, gateway=replace(settings.gateway, workers=worker_count(settings.gateway.workers)))
    return tuple(
        f"llmgw.yaml {change.path} is {change.new or '(absent)'} in the settings in force but "
        f"{change.old or '(absent)'} runs: it takes effect only when the control plane starts again; run `llmgw restart`"
        for change in restart_only_changes(running, wanted) if not _overridden(change.path, overridden))


def command_line_keys(config) -> frozenset[str]:
    """The llmgw.yaml paths a `ControlConfig` sets itself (from `llmgw server`'s options), which the settings do
    not decide: `restart_notes` leaves them out. No gateway (`--no-gateway`) leaves out all of
    `listeners.gateway`."""
    keys = {path for path, given in (
        ("listeners.gateway.host", config.gateway_listener is not None),
        ("listeners.gateway.port", config.gateway_listener is not None),
        ("listeners.gateway.workers", config.gateway_workers is not None),
        ("listeners.gateway", not config.gateway),
        ("listeners.admin", config.admin_listener is not None),
        ("listeners.agents", config.agents_listener is not None),
        ("store", config.store is not None),
        ("tracing.endpoint", config.otlp_endpoint is not None or config.tracer_provider is not None),
        ("tracing.sample_ratio", config.tracer_provider is not None),
        ("tracing.sample_requests", config.request_sample_ratio is not None),
    ) if given}
    return frozenset(keys)

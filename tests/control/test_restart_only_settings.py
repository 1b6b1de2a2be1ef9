"""`listeners.gateway.workers` (and the other keys read only at start) changed by a commit: the control plane says,
as a warning logged once and a status note, that it takes effect only with `llmgw restart`; keys given on the
command line are no note (a real control plane, commits to a real repository)."""

from __future__ import annotations

import logging
import os
from dataclasses import replace

import pytest
import trio

from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.restart_only import restart_notes
from llmgw.settings import ClusterSettings, Listener, StoreSettings, init_repository

from .conftest import write_seed
from .test_in_process_fleet import commit_directly

RESTART = "it takes effect only when the control plane starts again; run `llmgw restart`"
ONE_WORKER = "gateway: {host: 127.0.0.1, port: 0}"


def warnings_about(caplog, key: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and key in r.getMessage()]


@pytest.mark.parametrize("gateway_workers, noted", [(None, True), (1, False)], ids=["from-settings", "command-line"])
async def test_a_gateway_workers_commit_is_said_to_need_a_restart(tmp_path, caplog, gateway_workers, noted):
    repo = tmp_path / "settings.git"
    seed = write_seed(tmp_path / "seed", "ab" * 32)
    init_repository(repo, seed)
    yaml = (seed / "llmgw.yaml").read_text()
    assert ONE_WORKER in yaml
    plane = ControlPlane(ControlConfig(repo=str(repo), state_dir=tmp_path / "state", gateway_workers=gateway_workers))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        assert "notes" not in plane.status(readings=False)
        two = commit_directly(repo, "llmgw.yaml", yaml.replace(ONE_WORKER, ONE_WORKER[:-1] + ", workers: 2}").encode(),
                              "two gateway workers")
        assert (await plane.reload()).settings.commit == two
        expected = [f"llmgw.yaml listeners.gateway.workers is 2 in the settings in force but 1 runs: {RESTART}"]
        if not noted:  # `llmgw server --gateway-workers 1` decides at every start, whatever the settings say
            expected = []
        assert plane.status(readings=False).get("notes", []) == expected
        commit_directly(repo, "projects.yaml", (seed / "projects.yaml").read_bytes() + b"# touched\n", "another")
        await plane.reload()
        assert warnings_about(caplog, "listeners.gateway.workers") == expected  # logged once, not per commit
        commit_directly(repo, "llmgw.yaml", yaml.encode(), "back to one worker")
        await plane.reload()
        assert "notes" not in plane.status(readings=False)
        nursery.cancel_scope.cancel()


RUNNING = replace(ClusterSettings(name="c"), gateway=Listener(port=8080, workers=2))


@pytest.mark.parametrize("settings, overridden, notes", [
    (replace(RUNNING, gateway=Listener(port=8080, workers="auto")), (), 0 if os.cpu_count() == 2 else 1),
    (replace(RUNNING, gateway=Listener(port=9090, workers=2)), (), 1),
    (replace(RUNNING, gateway=Listener(port=9090, workers=2)), ("listeners.gateway.port",), 0),
    (replace(RUNNING, gateway=Listener(port=9090, workers=3)), ("listeners.gateway.port",), 1),
    (replace(RUNNING, store=StoreSettings(kind="postgresql", url="postgresql://u:hunter2@db/llmgw")), (), 2),
    (replace(RUNNING, store=StoreSettings(kind="postgresql", url="postgresql://u:hunter2@db/llmgw")), ("store",), 0),
    (replace(RUNNING, reconcile_interval=1.0, serving_stopped=True), (), 0),  # applied without a restart
])
def test_restart_notes_name_each_key_read_at_start_that_the_settings_decide(settings, overridden, notes):
    found = restart_notes(RUNNING, overridden, settings)
    assert len(found) == notes and all(RESTART in note for note in found)
    assert not any("hunter2" in note for note in found)

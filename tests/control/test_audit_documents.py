"""What audit commits hold and say: status snapshots, their changes, commit messages."""

from __future__ import annotations

import pytest

from llmgw.control.audit import audit_message, audit_snapshot, dump_yaml, state_changes
from llmgw.control.state import ActionRecord, Outcome, PassRecord


def snap(replicas=None, nodes=None, bad=None):
    settings = {"commit": "c" * 40}
    if bad:
        settings["bad"] = {"commit": bad, "issues": []}
    return {"settings": settings, "replicas": replicas or {}, "nodes": nodes or {}}


@pytest.mark.parametrize(
    "before, after, expected",
    [
        (None, snap({"tiny-0": {"state": "starting", "node": "n1"}}), ["tiny-0 starting on n1"]),
        (snap({"tiny-0": {"state": "starting", "node": "n1"}}), snap({"tiny-0": {"state": "ready", "node": "n1"}}),
         ["tiny-0 ready on n1"]),
        (snap({"tiny-0": {"state": "ready", "node": "n1"}}), snap({}), ["tiny-0 gone"]),
        (snap(nodes={"n2": {"state": "connected"}}), snap(nodes={"n2": {"state": "lost"}}), ["node n2 lost"]),
        (snap(), snap(bad="b" * 40), ["settings bbbbbbbbbbbb does not validate"]),
        (snap({"a-0": {"state": "ready"}}), snap({"a-0": {"state": "ready"}}), []),
    ],
)
def test_state_changes_name_what_changed_between_snapshots(before, after, expected):
    assert state_changes(before, after) == expected


def record(*actions: ActionRecord, converged=False) -> PassRecord:
    return PassRecord(7, "settings abc", "a" * 40, 0.0, 0.01, actions=actions, converged=converged)


def test_a_message_says_what_was_sent_for_which_settings_commit():
    sent = ActionRecord("start", "n1", "tiny-1/0", "tiny", "new replica", Outcome.SENT)
    waiting = ActionRecord("stop", "n2", "tiny-0/0", "tiny", "", Outcome.BACKING_OFF, error="node n2 went away")
    message = audit_message(record(sent, waiting))
    subject, _, body = message.partition("\n\n")
    assert subject == "pass 7 for settings aaaaaaaaaaaa: start tiny-1/0 on n1"
    assert "Settings-Commit: " + "a" * 40 in body
    assert "- stop tiny-0/0 on n2: backing off: node n2 went away" in body


def test_a_pass_that_sent_nothing_is_named_by_what_changed():
    assert audit_message(record(converged=True), ["tiny-0 ready on n1"]).startswith(
        "pass 7 for settings aaaaaaaaaaaa: tiny-0 ready on n1\n")
    assert audit_message(record(converged=True)).splitlines()[0].endswith(": converged")


def test_snapshots_ignore_times_and_pass_numbers_and_render_as_yaml():
    a = {**snap(), "pass": {"number": 1, "converged": True, "started_at": 1.0, "trigger": "timer"}}
    b = {**snap(), "pass": {"number": 2, "converged": True, "started_at": 9.0, "trigger": "x"}}
    assert audit_snapshot(a) == audit_snapshot(b)
    assert dump_yaml(a).decode().startswith("settings:\n  commit: ccc")


def test_the_audit_queue_and_the_recovery_countdown_alone_make_no_commit():
    # a pass while an audit write is queued used to differ from the next one by `audit_pending` alone: an extra
    # commit (test_in_process_fleet's idle check caught it now and then)
    base = {"settings": {"commit": "c"}, "control_plane": {"leader": True, "audit_pending": 0, "fleet": "ready"}}
    busy = {"settings": {"commit": "c"}, "control_plane": {"leader": True, "audit_pending": 1,
                                                           "fleet": "recovering: 0 of 1 known nodes reconnected"}}
    assert audit_snapshot(base) == audit_snapshot(busy)
    assert audit_snapshot(base) != audit_snapshot({**base, "control_plane": {"leader": False, "audit_pending": 0}})

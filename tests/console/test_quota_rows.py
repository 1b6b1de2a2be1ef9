"""The Quotas page's rows, pure (`llmgw.console.quotas`), over settings loaded from a real tree (examples/cluster-repo,
whose projects.yaml sets limits on projects, teams and the organisation): each project's chain in the gateway's order
(`Settings.quota_scopes`), every scope asked of the store once, a shared team's or organisation's row naming the
other projects under it, no row without a reading, a project the settings lack left out."""

from __future__ import annotations

from pathlib import Path

from llmgw.console.quotas import project_quotas, scopes_of
from llmgw.settings import load_directory
from llmgw.store import LimitUse

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"


def test_rows_follow_the_gateways_chain_and_name_who_shares_a_limit() -> None:
    settings = load_directory(EXAMPLE)
    assert [key for key, _ in settings.quota_scopes("ci")] == ["project:ci", "team:platform", "org:acme"]
    scopes = scopes_of(settings, ["demo", "ci", "gone"])
    assert [key for key, _ in scopes] == ["project:demo", "team:platform", "org:acme", "project:ci"]  # each once
    uses = [LimitUse("project:ci", "requests_per_minute", 120, 30, 12.0),
            LimitUse("team:platform", "concurrent_requests", 64, 80, 1.0),
            LimitUse("org:acme", "budget", 5000.0, 1250.5, 86400.0)]
    (ci,) = project_quotas(settings, ["ci", "gone"], uses)
    assert (ci.project, ci.team, ci.organisation) == ("ci", "platform", "acme")
    assert [(r.scope, r.words, r.used, r.remaining, r.ratio) for r in ci.rows] == [
        ("project ci", "requests per minute", 30, 90, 0.25),
        ("team platform", "requests in flight", 80, 0, 1.0),  # over the limit (lowered meanwhile): full, none left
        ("organisation acme", "cost per UTC month", 1250.5, 3749.5, 1250.5 / 5000)]
    assert [r.frees_in for r in ci.rows] == [12.0, None, 86400.0] and [r.money for r in ci.rows] == [False, False, True]
    assert ci.rows[1].shared_with == ("demo",)
    assert "assistants" in ci.rows[2].shared_with and "ci" not in ci.rows[2].shared_with
    assert project_quotas(settings, ["ci"], [])[0].rows == ()  # nothing read: no row

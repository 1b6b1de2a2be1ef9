"""A history entry opens the settings diff its audit commit applied (the semantic diff of `llmgw diff`), read from
a real settings repository with real audit commits."""

from __future__ import annotations

import re
from functools import partial

import trio

from control.test_in_process_fleet import push_catalog, set_replicas
from llmgw.console import Console
from llmgw.control.audit_diff import applied_diff
from llmgw.control.state import ControlState
from llmgw.settings import append_audit, load_commit, read_audit_log

from .test_console_security import TOKEN, admin_only


BEARER = {"Authorization": f"Bearer {TOKEN}", "Accept": "text/html"}


def status_naming(commit: str) -> dict[str, bytes]:
    return {"status.yaml": f"settings:\n  commit: {commit}\n  serving_stopped: false\n".encode()}


async def audited_repo(tmp_path, settings_repo) -> tuple[str, str, list[str]]:
    """Settings commits A (one replica of tiny) and B (two), and audit commits naming A, then B, then B again."""
    first = load_commit(settings_repo).commit
    await push_catalog(tmp_path / "checkout", settings_repo, set_replicas(2), "tiny: two replicas")
    second = load_commit(settings_repo).commit
    audits = [append_audit(settings_repo, status_naming(c), f"pass {n}: settings {c[:12]}")
              for n, c in enumerate((first, second, second), 1)]
    return first, second, audits


async def test_an_audit_commit_that_moved_the_settings_shows_what_changed(tmp_path, settings_repo):
    first, second, (a1, a2, a3) = await audited_repo(tmp_path, settings_repo)
    moved = applied_diff(settings_repo, a2)
    assert (moved.before, moved.after, moved.error) == (first, second, "")
    assert moved.diff.to_text() == "~ model tiny\n    replicas: 1 -> 2\n"
    assert not applied_diff(settings_repo, a3).diff and applied_diff(settings_repo, a3).before == second
    opening = applied_diff(settings_repo, a1)
    assert opening.before is None and opening.after == first and not opening.diff


async def test_the_history_page_links_each_entry_to_the_diff_it_applied(tmp_path, settings_repo):
    first, second, (_a1, a2, _a3) = await audited_repo(tmp_path, settings_repo)

    async def history(limit: int) -> list:
        return await trio.to_thread.run_sync(read_audit_log, str(settings_repo), limit)

    async def diff(commit: str):
        return await trio.to_thread.run_sync(partial(applied_diff, settings_repo, commit))

    console = Console(ControlState, authorise=admin_only, history=history,
                      applied_diff=diff)
    client = console.app.test_client()
    listing = await (await client.get("/console/history", headers=BEARER)).get_data(as_text=True)
    assert f'href="/console/history/{a2}"' in listing
    response = await client.get(f"/console/history/{a2}", headers=BEARER)
    html = await response.get_data(as_text=True)
    assert response.status_code == 200
    assert re.search(r'<li class="changed"><strong>~ model tiny</strong>', html)
    assert "<code>replicas</code>: 1 → 2" in html
    assert f'<code id="diff-before">{first[:12]}</code>' in html and f'<code id="diff-after">{second[:12]}' in html
    assert (await client.get("/console/history/" + "0" * 40, headers=BEARER)).status_code == 404

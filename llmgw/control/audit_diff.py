"""The settings diff an audit commit applied: what changed between the settings commit its status names and the
one its parent audit commit names (the same semantic diff as `llmgw diff`). Blocking (git reads): call it in a
worker thread. Used by the console's history pages.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ruamel.yaml import YAML

from llmgw.errors import SettingsError
from llmgw.settings import SettingsDiff, diff_settings, load_commit, read_audit_file


@dataclass(frozen=True)
class AppliedDiff:
    """`before` and `after`: the settings commits (None: none in force); `diff` what changed from one to the other
    (empty when the commit did not change); `error` a sentence when a settings commit could not be loaded."""

    before: str | None
    after: str | None
    diff: SettingsDiff
    error: str = ""


def _settings_commit(repo_path: str, audit_commit: str) -> str | None:
    data = read_audit_file(repo_path, "status.yaml", audit_commit)
    if data is None:
        return None
    doc: Any = YAML(typ="safe").load(data) or {}
    return ((doc.get("settings") or {}).get("commit")) if isinstance(doc, dict) else None


def applied_diff(repo_path: str | os.PathLike[str], audit_commit: str) -> AppliedDiff:
    """The settings diff audit commit `audit_commit` (an id on refs/llmgw/audit) applied.

    The first audit commit (no parent) and a commit whose settings commit did not change return an empty diff.
    Raises: SettingsError when
    `audit_commit` names no commit.
    """
    path = str(repo_path)
    after = _settings_commit(path, audit_commit)
    try:
        before = _settings_commit(path, f"{audit_commit}^")
    except SettingsError:
        before = None  # the first audit commit: it has no parent
    if after is None or before is None or before == after:
        return AppliedDiff(before, after, SettingsDiff())
    try:
        return AppliedDiff(before, after, diff_settings(load_commit(path, before), load_commit(path, after)))
    except SettingsError as exc:
        return AppliedDiff(before, after, SettingsDiff(), f"a settings commit could not be loaded: {exc}")

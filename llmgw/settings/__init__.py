"""llmgw.settings: read, validate and diff settings trees (directories or git commits), and the commits llmgw writes.

Loading: `load_directory(path)`, `load_commit(repo_path, rev)` -> Settings (raise SettingsError listing every
error as `file:line:column: key.path: reason`). Diff: `diff_settings(a, b)` -> SettingsDiff. Repository:
`init_repository(path, seed_dir, notify_url)`. Commits: `set_serving_stopped`, `append_audit`, `set_ref`,
`read_audit_log`, `read_audit_file`.
"""

from llmgw.settings.committing import (
    APPLIED_REF, AUDIT_REF, AuditEntry, append_audit, read_audit_file, read_audit_log, set_ref, set_serving_stopped,
)
from llmgw.settings.diffing import Change, FieldChange, SettingsDiff, diff_settings
from llmgw.settings.loading import load_commit, load_directory
from llmgw.settings.model import (
    Adapter, AgentSettings, ClusterSettings, Endpoint, EngineVersion, Listener, Model, Organisation, Prices,
    Project, Quota, Resources, Settings, StoreSettings, Team, WeightsFile,
)
from llmgw.settings.reading import MAX_FILE_BYTES
from llmgw.settings.repository import NOTIFY_URL_KEY, init_repository

__all__ = [
    "Adapter", "AgentSettings", "ClusterSettings", "Endpoint", "EngineVersion", "Listener", "Model",
    "Organisation", "Prices", "Project", "Quota", "Resources", "Settings", "StoreSettings", "Team", "WeightsFile",
    "load_directory", "load_commit", "diff_settings", "SettingsDiff", "Change", "FieldChange",
    "init_repository", "NOTIFY_URL_KEY", "MAX_FILE_BYTES",
    "set_serving_stopped", "append_audit", "set_ref", "read_audit_log", "read_audit_file", "AuditEntry",
    "AUDIT_REF", "APPLIED_REF",
]

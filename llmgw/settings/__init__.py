"""llmgw.settings: read, validate and diff settings trees (directories or git commits), and the commits llmgw writes.

Loading: `load_directory(path)`, `load_commit(repo_path, rev)` -> Settings (raise SettingsError listing every
error as `file:line:column: key.path: reason`; keys accepted but not acted on yet are warnings, see
`NOT_ACTED_ON`; `load_commit(..., trust_hook_record=True)` skips the schema check of a tree the pre-receive hook
recorded as valid, see `read_valid_trees`, `validation_key`, `VALID_TREES_FILE`). Diff: `diff_settings(a, b)` ->
SettingsDiff. Repository: `init_repository(path, seed_dir, notify_url, branch)`, `install_hooks`. Refs and
config: `branch_head`, `ref_commit`, `fetch_mirror`, `set_config_value`, `discover_repository`, `redact_url`,
`AUDIT_REF`, `APPLIED_REF`. Commits: `commit_edit` (the one writer of edits made for a person: `edit_commits`), `append_audit`, `set_ref`, `read_audit_log`,
`read_audit_file`. History: `commits_since(repo, old, new)` (what changed on a branch since a commit),
`read_audit_chain`, `audit_commit`.
"""

from llmgw.settings.committing import (
    AuditEntry, append_audit, read_audit_file, read_audit_log, set_ref,
)
from llmgw.settings.edit_commits import EditCommit, commit_edit
from llmgw.settings.diffing import (
    RESTART_ONLY, Change, FieldChange, SettingsDiff, diff_settings, restart_only_changes,
)
from llmgw.settings.history import BranchCommit, audit_commit, commits_since, read_audit_chain
from llmgw.settings.loading import SchemaCheck, load_commit, load_directory
from llmgw.settings.people import MEMBER, OPERATOR, ROLES, VIEWER, Access, People
from llmgw.settings.model import (
    ConsoleOidc,
    Adapter, AgentSettings, ClusterSettings, Endpoint, EngineVersion, Listener, Model, Organisation, Prices,
    Project, Quota, Resources, Rollout, Scaling, Settings, StoreSettings, Team, Tracing, WeightsFile,
)
from llmgw.settings.reading import MAX_FILE_BYTES
from llmgw.settings.reverting import propose_revert
from llmgw.settings.refs import (
    APPLIED_REF, AUDIT_REF, BRANCH_KEY, DEFAULT_BRANCH, branch_head, discover_repository, fetch_mirror, redact_url,
    ref_commit, set_config_value,
)
from llmgw.settings.repository import (
    HOOK_TOKEN_FILE, NOTIFY_CA_KEY, NOTIFY_URL_KEY, hook_token, init_repository, install_hooks,
)
from llmgw.settings.schemas import validate_data
from llmgw.settings.unbuilt import NOT_ACTED_ON, UNBUILT, UnbuiltKey, is_not_acted_on
from llmgw.settings.valid_trees import VALID_TREES_FILE, read_valid_trees, validation_key

__all__ = [
    "Adapter", "AgentSettings", "ClusterSettings", "Endpoint", "EngineVersion", "Listener", "Model",
    "Access", "ConsoleOidc", "People", "ROLES", "OPERATOR", "VIEWER", "MEMBER", "Organisation", "Prices", "Project", "Quota",
    "Resources", "Rollout", "Scaling", "Settings", "StoreSettings", "Team", "Tracing",
    "WeightsFile",
    "load_directory", "load_commit", "SchemaCheck", "validate_data",
    "VALID_TREES_FILE", "read_valid_trees", "validation_key", "diff_settings", "SettingsDiff", "Change", "FieldChange",
    "RESTART_ONLY", "restart_only_changes",
    "init_repository", "install_hooks", "NOTIFY_URL_KEY", "NOTIFY_CA_KEY", "HOOK_TOKEN_FILE", "hook_token", "BRANCH_KEY", "MAX_FILE_BYTES",
    "EditCommit", "commit_edit", "append_audit", "set_ref", "read_audit_log", "read_audit_file", "AuditEntry",
    "AUDIT_REF", "APPLIED_REF", "DEFAULT_BRANCH", "branch_head", "ref_commit", "fetch_mirror", "set_config_value",
    "discover_repository", "redact_url", "NOT_ACTED_ON", "UNBUILT", "UnbuiltKey", "is_not_acted_on",
    "BranchCommit", "audit_commit", "commits_since", "read_audit_chain", "propose_revert",
]

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
Each name is imported from its module when first read (`_EXPORTS`), so that a light module of this package
(`post_receive`, which the post-receive hook runs on every push) does not bring the model, jsonschema and ruamel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmgw.lazy_exports import lazy_exports

if TYPE_CHECKING:
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
    from llmgw.settings.post_receive import HOOK_TOKEN_FILE, NOTIFY_CA_KEY, NOTIFY_URL_KEY
    from llmgw.settings.repository import hook_token, init_repository, install_hooks
    from llmgw.settings.schemas import validate_data
    from llmgw.settings.unbuilt import NOT_ACTED_ON, UNBUILT, UnbuiltKey, is_not_acted_on
    from llmgw.settings.valid_trees import VALID_TREES_FILE, read_valid_trees, validation_key

_EXPORTS: dict[str, tuple[str, ...]] = {
    "committing": ("AuditEntry", "append_audit", "read_audit_file", "read_audit_log", "set_ref"),
    "edit_commits": ("EditCommit", "commit_edit"),
    "diffing": ("RESTART_ONLY", "Change", "FieldChange", "SettingsDiff", "diff_settings", "restart_only_changes"),
    "history": ("BranchCommit", "audit_commit", "commits_since", "read_audit_chain"),
    "loading": ("SchemaCheck", "load_commit", "load_directory"),
    "people": ("MEMBER", "OPERATOR", "ROLES", "VIEWER", "Access", "People"),
    "model": ("ConsoleOidc", "Adapter", "AgentSettings", "ClusterSettings", "Endpoint", "EngineVersion", "Listener",
              "Model", "Organisation", "Prices", "Project", "Quota", "Resources", "Rollout", "Scaling", "Settings",
              "StoreSettings", "Team", "Tracing", "WeightsFile"),
    "reading": ("MAX_FILE_BYTES",),
    "reverting": ("propose_revert",),
    "refs": ("APPLIED_REF", "AUDIT_REF", "BRANCH_KEY", "DEFAULT_BRANCH", "branch_head", "discover_repository",
             "fetch_mirror", "redact_url", "ref_commit", "set_config_value"),
    "post_receive": ("HOOK_TOKEN_FILE", "NOTIFY_CA_KEY", "NOTIFY_URL_KEY"),
    "repository": ("hook_token", "init_repository", "install_hooks"),
    "schemas": ("validate_data",),
    "unbuilt": ("NOT_ACTED_ON", "UNBUILT", "UnbuiltKey", "is_not_acted_on"),
    "valid_trees": ("VALID_TREES_FILE", "read_valid_trees", "validation_key"),
}
"""Each name of this package's interface, by the submodule that defines it. A name is imported when first read
(PEP 562), so that `llmgw.settings.<light module>` (the post-receive hook's `post_receive`, `refs`, `valid_trees`)
does not import jsonschema, ruamel and the whole model with it."""
__getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), _EXPORTS)

"""The refs of a settings repository, its git config, and the bare mirror of a remote one (pygit2 only).

The words, defined here once: the settings branch (`refs/heads/<branch>`, default `main`) holds the cluster's
settings and is the only ref a push may move (the pre-receive hook refuses the rest); `AUDIT_REF` is the chain
of audit commits and `APPLIED_REF` the last settings commit the fleet converged to, both written by the control
plane with pygit2 (hooks do not run for them).

Reading: `branch_head`, `ref_commit`, `discover_repository`. Writing: `set_config_value`. A remote settings
repository is read through a bare mirror kept by `fetch_mirror`; git's own transports (libgit2) do that network
I/O, nothing else in llmgw.settings touches the network. `redact_url` keeps passwords and tokens out of text.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
import pygit2

from llmgw.errors import Issue, SettingsError
from llmgw.settings.reading import open_repository
from llmgw.settings.url_secrets import TOKEN_QUERY_PARAMETERS

DEFAULT_BRANCH = "main"
AUDIT_REF = "refs/llmgw/audit"
APPLIED_REF = "refs/llmgw/applied"
BRANCH_KEY = "llmgw.branch"
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s]*)@")
"""A URL's user information: up to the authority's LAST "@" (a password written unquoted may hold "@"; the host
follows the last one, as libpq and git read such URLs), never past the first "/" or a space."""


def branch_ref(branch: str) -> str:
    """"main" -> "refs/heads/main"."""
    return f"refs/heads/{branch}"


_TOKEN_PARAMETER = re.compile(r"(?P<name>[?&;](?:" + "|".join(re.escape(name) for name in sorted(
    TOKEN_QUERY_PARAMETERS, key=len, reverse=True)) + r")=)(?P<value>[^&#\s]+)", re.IGNORECASE)


def redact_url(text: str) -> str:
    """`text` with the user information of every URL in it (`user:password@`, `token@`: the whole authority up to
    its last "@") replaced by `***@`, and the value of every query parameter that carries a token
    (`llmgw.settings.url_secrets.TOKEN_QUERY_PARAMETERS`: private_token, access_token, password, ...) by `***`.

    "https://u:s3cret@forge/x.git" -> "https://***@forge/x.git", "https://u:p@ss@forge/x" -> "https://***@forge/x",
    "https://forge/x?private_token=abc" -> "https://forge/x?private_token=***"; text without a URL is unchanged.
    """
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", text)
    return _TOKEN_PARAMETER.sub(lambda m: f"{m.group('name')}***", text)


def _password_free(url: str, text: str) -> str:
    """`text` with `url`'s user information removed wherever it appears (libgit2 may quote it, whole or in part).

    The secret is the password of `user:password`, or the whole user part when it has no password (a token such as
    `https://TOKEN@host/`); a user name beside a password is not blanked on its own, so that a name such as `root`
    does not turn `/tmp/pytest-of-root` into `pytest-of-***`. Secrets shorter than 4 characters are left (they would
    blank ordinary words)."""
    text = redact_url(text)
    match = _USERINFO.match(url)
    if match:
        userinfo = match.group("userinfo")
        _, colon, password = userinfo.partition(":")
        for secret in (userinfo, password) if colon else (userinfo,):
            if len(secret) >= 4:
                text = text.replace(secret, "***")
    return text


def _commit_of(repo: pygit2.Repository, ref: str) -> str | None:
    try:
        return str(repo.references[ref].peel(pygit2.Commit).id)
    except (KeyError, ValueError, pygit2.GitError, pygit2.InvalidSpecError):
        return None


def branch_head(repo_path: str | os.PathLike[str], branch: str = DEFAULT_BRANCH) -> str | None:
    """The commit id (40 hex) `refs/heads/<branch>` points at, or None when there is no such branch yet.

    Blocking (reads the repository). Raises: SettingsError when `repo_path` is not a git repository.
    """
    return _commit_of(open_repository(repo_path), branch_ref(branch))


def ref_commit(repo_path: str | os.PathLike[str], ref: str) -> str | None:
    """The commit id (40 hex) the full ref name `ref` (e.g. APPLIED_REF) points at, or None when it is absent
    or points at no commit. Blocking. Raises: SettingsError when `repo_path` is not a git repository.
    """
    return _commit_of(open_repository(repo_path), ref)


def discover_repository(start: str | os.PathLike[str]) -> str | None:
    """The git directory of the repository holding `start` (searching upwards, like git), or None when none does."""
    try:
        return pygit2.discover_repository(str(start))
    except (pygit2.GitError, OSError):
        return None


def set_config_value(repo_path: str | os.PathLike[str], key: str, value: str) -> None:
    """Set git config `key` (e.g. "llmgw.notifyurl") to `value` in the repository's own config file.

    Blocking. Raises: SettingsError when `repo_path` is not a git repository or the config cannot be written.
    """
    repo = open_repository(repo_path)
    try:
        repo.config[key] = value
    except (pygit2.GitError, ValueError, OSError) as exc:
        raise SettingsError([Issue(str(repo_path), 0, 0, key, f"cannot be set in the repository's config ({exc})")]) from exc


def fetch_mirror(url: str, mirror_path: str | os.PathLike[str], branch: str = DEFAULT_BRANCH, *,
                 ssh_key: str | os.PathLike[str] | None = None) -> None:
    """Bring the bare mirror at `mirror_path` up to date with `url`'s `refs/heads/<branch>`.

    The first call clones `url` bare into `mirror_path` (its parent is created); later calls fetch the branch,
    moving it even when the remote was rewritten. `url` is anything git takes (https, ssh, file://, a path).
    Blocking network I/O through libgit2: run it in a thread. Raises: OSError with a sentence naming the URL
    with its password or token replaced by `***`, when the remote cannot be reached, refuses us, or the mirror
    is not a repository.

    `ssh_key`: an ssh private key file (OpenSSH or PEM, no passphrase: a deploy key) that an ssh URL authenticates
    with, as the URL's user (`git` when the URL names none); its `.pub` beside it is used when present. With or without
    it, an ssh server's host key is checked by libgit2 against `$HOME/.ssh/known_hosts` (an unknown or changed host
    key refuses the connection: tests/settings/test_deploy_key.py).
    """
    mirror = Path(mirror_path)
    callbacks = _DeployKey(Path(ssh_key)) if ssh_key is not None else _HostChecked()
    try:
        if not (mirror / "HEAD").exists():
            mirror.parent.mkdir(parents=True, exist_ok=True)
            pygit2.clone_repository(url, str(mirror), bare=True, callbacks=callbacks)
            return
        repo = pygit2.Repository(str(mirror))
        repo.remotes["origin"].fetch([f"+{branch_ref(branch)}:{branch_ref(branch)}"], callbacks=callbacks)
    except KeyError as exc:
        raise OSError(f"the mirror {mirror} has no remote 'origin'; delete it and llmgw clones "
                      f"{redact_url(url)} again") from exc
    except (pygit2.GitError, OSError, ValueError) as exc:
        reason = _password_free(url, str(exc) or type(exc).__name__)
        raise OSError(f"cannot fetch {redact_url(url)}: {reason}") from exc


class _HostChecked(pygit2.RemoteCallbacks):
    """libgit2's callbacks that refuse a remote whose host libgit2 could not check (`valid`: an ssh host key not in
    ~/.ssh/known_hosts or differing from it, a TLS certificate that does not verify). `certificate_check` must say so
    itself: pygit2's default (Passthrough) lets libgit2 1.9 ACCEPT an ssh host that known_hosts does not list (seen
    here; tests/settings/test_deploy_key.py). Every fetch uses these, with or without a deploy key."""

    def certificate_check(self, certificate: None, valid: bool, host: bytes) -> bool:
        if not valid:
            name = host.decode(errors="replace") if isinstance(host, bytes) else host
            raise pygit2.GitError(f"the host key of {name} is not in {Path.home() / '.ssh' / 'known_hosts'} or differs "
                                  f"from it: add the key the host really has (`ssh-keyscan {name}`, compared with "
                                  "the host's own /etc/ssh/ssh_host_*_key.pub)")
        return True


class _DeployKey(_HostChecked):
    """`_HostChecked` reaching an ssh remote with the private key file `key` (no passphrase), as the URL's user."""

    def __init__(self, key: Path):
        super().__init__()
        self.key = key

    def credentials(self, url: str, username_from_url: str | None, allowed_types: pygit2.enums.CredentialType):
        if not allowed_types & pygit2.enums.CredentialType.SSH_KEY:
            raise pygit2.GitError(f"{redact_url(url)} asks for no ssh key (an https URL takes a token in the URL, "
                                  "not --repo-ssh-key)")
        public = self.key.with_name(self.key.name + ".pub")
        return pygit2.Keypair(username_from_url or "git", str(public) if public.exists() else None, str(self.key), "")

"""Redaction as a property (hypothesis): no byte of a secret reaches any output of the functions that hide secrets:
store URLs (`llmgw.store.postgres.redact_url`, `llmgw.store.redacted`), URLs in git's error text
(`llmgw.settings.refs.redact_url` and the error text of a fetch), the settings diff (`diff_settings`,
`restart_only_changes`) and the agent settings an agent keeps on disk (`llmgw.agent.slurm.without_secrets`).

Secrets are drawn from characters no other part of an input or output uses (upper case letters and punctuation that a
URL's user part may hold; every other part is lower case letters and digits), so "no byte of the secret" is checked as
"none of the secret's characters" wherever the structure of the output is not known exactly."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.agent.slurm import without_secrets
from llmgw.settings import diff_settings, load_directory, restart_only_changes
from llmgw.settings.model import StoreSettings
from llmgw.settings.refs import _password_free
from llmgw.settings.refs import redact_url as redact_git_url
from llmgw.store import redacted
from llmgw.store.postgres import redact_url, url_password
from llmgw.wire import pb

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"
SECRET_ONLY = "ABCDEFGHIJKLMNOPQRSTUVWXYZ!$+;"
"""Characters only secrets use."""
NAMES = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)
HOSTS = st.builds("{}.{}".format, NAMES, st.sampled_from(["example", "internal"]))
PORTS = st.sampled_from(["", ":5432", ":6543"])
SECRETS = st.text(SECRET_ONLY, min_size=1, max_size=16)
WORDS = st.lists(st.text("abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6), max_size=3).map(" ".join)

FAST = settings(max_examples=150, deadline=None)


def no_secret_char(text: str) -> bool:
    return not set(text) & set(SECRET_ONLY)


@FAST
@given(user=NAMES, password=st.text(SECRET_ONLY + "@:", min_size=1, max_size=16), host=HOSTS, port=PORTS,
       database=NAMES)
def test_a_store_urls_password_in_its_user_part_is_hidden_whole(user, password, host, port, database):
    """Written as it comes, unquoted: a password may hold "@" and ":" (the host follows the last "@")."""
    url = f"postgresql://{user}:{password}@{host}{port}/{database}"
    shown = f"postgresql://{user}:***@{host}{port}/{database}"
    assert redact_url(url) == redacted(url) == shown
    assert url_password(url) == password  # what error text is scrubbed of


@FAST
@given(user=NAMES, password=st.text(SECRET_ONLY.replace("+", ""), min_size=1, max_size=16), host=HOSTS,
       database=NAMES, before=st.booleans())
def test_a_store_urls_password_parameter_is_hidden(user, password, host, database, before):
    """libpq's `?password=` ("+" would mean a space in a query: left out of these passwords)."""
    params = [f"user={user}", "sslmode=require"]
    params.insert(0 if before else 2, f"password={password}")
    shown = [p if not p.startswith("password=") else "password=***" for p in params]
    url = f"postgresql://{host}/{database}?{'&'.join(params)}"
    assert redact_url(url) == redacted(url) == f"postgresql://{host}/{database}?{'&'.join(shown)}"
    assert url_password(url) == password


@st.composite
def git_texts(draw) -> tuple[str, str]:
    """Error text quoting git URLs with a user and password or a token, and the text as it must be shown. A password
    may hold a raw "@" (RFC 3986 wants it percent-encoded, but people write it as it is; the host follows the last)."""
    text, shown = [], []
    for _ in range(draw(st.integers(1, 3))):
        words, scheme, host = draw(WORDS), draw(st.sampled_from(["https://", "ssh://", "http://"])), draw(HOSTS)
        password = st.text(SECRET_ONLY + "@", min_size=1, max_size=16)
        userinfo = draw(st.one_of(st.builds("{}:{}".format, NAMES, password), SECRETS))  # user:password, or a token
        path = draw(st.sampled_from(["/x.git", ":22/team/settings", ""]))
        text.append(f"{words} {scheme}{userinfo}@{host}{path}")
        shown.append(f"{words} {scheme}***@{host}{path}")
    return "; ".join(text), "; ".join(shown)


@FAST
@given(git_texts())
def test_every_git_url_in_a_text_loses_its_user_part(case):
    text, shown = case
    assert redact_git_url(text) == shown


@FAST
@given(user=NAMES, password=st.text(SECRET_ONLY + ":@", min_size=4, max_size=16), host=HOSTS,
       quoted=st.lists(st.sampled_from(["url", "userinfo", "password", "words"]), min_size=1, max_size=4),
       words=WORDS)
def test_a_fetch_error_never_shows_the_remotes_password(user, password, host, quoted, words):
    """libgit2 may quote the URL, its user part or the password alone (passwords of 4 characters or more: a shorter
    string is left alone, as it would also match ordinary words)."""
    url = f"https://{user}:{password}@{host}/settings.git"
    parts = {"url": url, "userinfo": f"{user}:{password}", "password": password, "words": words}
    assert no_secret_char(_password_free(url, " ".join(f"'{parts[q]}'" for q in quoted)))


def test_a_user_name_beside_a_password_is_not_blanked_in_paths_but_a_token_alone_is():
    """A user name is not the secret of `user:password`: `root` must not turn `/tmp/pytest-of-root` into
    `pytest-of-***` (seen in an error message); a user part without a password is a token and is blanked."""
    text = "cannot read /tmp/pytest-of-root/key: the password s3cretpw failed"
    shown = _password_free("https://root:s3cretpw@forge.example/settings.git", text)
    assert shown == "cannot read /tmp/pytest-of-root/key: the password *** failed"
    token = "ghp_0123456789abcdef"
    assert _password_free(f"https://{token}@forge.example/s.git", f"auth {token} refused") == "auth *** refused"


@pytest.fixture(scope="module")
def example():
    return load_directory(EXAMPLE)


@FAST
@given(old=st.one_of(st.none(), SECRETS), new=SECRETS, user=NAMES, host=HOSTS)
def test_a_store_url_change_in_the_settings_diff_shows_no_password(example, old, new, user, host):
    def with_password(password):
        store = (StoreSettings() if password is None
                 else StoreSettings(kind="postgresql", url=f"postgresql://{user}:{password}@{host}/llmgw"))
        return replace(example, cluster=replace(example.cluster, store=store))

    before, after = with_password(old), with_password(new)
    diff = diff_settings(before, after)
    notes = restart_only_changes(before.cluster, after.cluster)
    assert [c.path for c in notes if c.path == "store.url"] == (["store.url"] if old != new else [])
    shown_notes = " ".join(f"{note.path} {note.old or ''} {note.new or ''}" for note in notes)
    for output in (diff.to_text(), json.dumps(diff.to_json()), shown_notes):
        assert no_secret_char(output), output


@FAST
@given(key=st.binary(min_size=8, max_size=64), password=SECRETS.filter(lambda s: len(s) >= 8), name=NAMES)
def test_agent_settings_kept_on_disk_hold_no_slurm_secret(key, password, name):
    settings_ = pb.AgentSettings()
    role = settings_.slurm
    role.munge_key, role.storage_password, role.node_name = key, password, name
    role.slurmdbd_conf = f"StorageUser={name}\nStoragePass={password}\n"
    kept = without_secrets(settings_)
    on_disk = kept.SerializeToString()
    assert key not in on_disk and password.encode() not in on_disk and no_secret_char(str(kept))
    assert kept.slurm.node_name == name and settings_.slurm.munge_key == key  # the original is left as it was

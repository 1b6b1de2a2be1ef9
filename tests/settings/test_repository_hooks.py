"""`llmgw repo init` makes a bare repository whose hooks refuse invalid pushes and notify on good ones.

Only the settings branch may move, forward, to settings that validate: other refs (the audit trail and the
applied ref above all), deletions and non-fast-forward updates are refused, each with a sentence.

Pushes go through the real `git` CLI from a clone (pygit2's own push to a local path skips hooks)."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pygit2
import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.errors import SettingsError
from llmgw.settings import (
    APPLIED_REF, AUDIT_REF, BRANCH_KEY, NOTIFY_URL_KEY, append_audit, init_repository, load_commit, set_ref,
)
from settings_trees import EXAMPLE

GIT = ["git", "-c", "user.name=Operator", "-c", "user.email=operator@acme.example", "-c", "init.defaultBranch=main"]


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GIT, *args], cwd=cwd, capture_output=True, text=True, check=check, timeout=60)


def clone(bare: Path, target: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(bare), str(target)], check=True, capture_output=True)
    return target


def change(work: Path, rel: str, old: str, new: str, message: str) -> None:
    path = work / rel
    path.write_text(path.read_text().replace(old, new, 1))
    git(work, "commit", "-qam", message)


class _Recorder(BaseHTTPRequestHandler):
    bodies: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers["Content-Length"])
        type(self).bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[HTTPServer]:
    """A loopback HTTP server answering with `handler` in a thread of its own, until the block ends."""
    server = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def notify_server() -> Iterator[tuple[str, list[dict]]]:
    _Recorder.bodies = []
    with _serving(_Recorder) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/settings/notify", _Recorder.bodies


def test_repo_init_makes_a_bare_repository_on_main_seeded_from_a_directory(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["repo", "init", str(tmp_path / "s.git"), "--from", str(EXAMPLE),
                                      "--notify-url", "http://127.0.0.1:1/x"])
    assert result.exit_code == 0, result.output
    repo = pygit2.Repository(str(tmp_path / "s.git"))
    assert repo.is_bare and repo.head.name == "refs/heads/main"
    assert repo.config[NOTIFY_URL_KEY] == "http://127.0.0.1:1/x"
    assert "gemma-3-270m" in load_commit(tmp_path / "s.git").models
    assert {p.name for p in (tmp_path / "s.git" / "hooks").iterdir()} >= {"pre-receive", "post-receive"}


def test_repo_init_refuses_an_invalid_seed_and_a_used_path(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "llmgw.yaml").write_text("name: Bad Name\n")
    with pytest.raises(SettingsError, match="llmgw.yaml:1:7: name: 'Bad Name' is not a valid name"):
        init_repository(tmp_path / "a.git", seed)
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("")
    with pytest.raises(SettingsError, match="exists and is not empty"):
        init_repository(used, EXAMPLE)


def test_invalid_push_is_refused_with_file_and_line_and_a_valid_one_is_accepted(tmp_path: Path, notify_server) -> None:
    url, bodies = notify_server
    bare = tmp_path / "settings.git"
    seed = init_repository(bare, EXAMPLE, notify_url=url)
    work = clone(bare, tmp_path / "work")

    change(work, "catalog/gemma-3-270m.yaml", "replicas: 1\n", "replicas: -1\n", "bad replicas")
    (work / "projects.yaml").write_text((work / "projects.yaml").read_text().replace("tokens_per_day: 2000000", "tokens_per_day: lots"))
    git(work, "commit", "-qam", "bad quota")
    refused = git(work, "push", "origin", "main", check=False)
    assert refused.returncode != 0
    assert "remote: refusing refs/heads/main" in refused.stderr
    assert "catalog/gemma-3-270m.yaml:13:11: replicas: -1 is less than the minimum of 0" in refused.stderr
    assert "projects.yaml:25:31: organisations.acme.teams.platform.projects.ci.quota.tokens_per_day: 'lots' is not of type 'integer'" in refused.stderr
    assert str(pygit2.Repository(str(bare)).references["refs/heads/main"].target) == seed
    assert bodies == []

    git(work, "reset", "-q", "--hard", "origin/main")
    change(work, "catalog/gemma-3-270m.yaml", "replicas: 1\n", "replicas: 2\n", "two replicas")
    accepted = git(work, "push", "origin", "main", check=False)
    assert accepted.returncode == 0, accepted.stderr
    assert "settings valid" in accepted.stderr
    head = git(work, "rev-parse", "HEAD").stdout.strip()
    assert load_commit(bare).commit == head
    assert bodies == [{"refs": [{"ref": "refs/heads/main", "old": seed, "new": head}]}]


def test_a_failed_notification_never_fails_the_push(tmp_path: Path) -> None:
    bare = tmp_path / "settings.git"
    init_repository(bare, EXAMPLE, notify_url="http://127.0.0.1:1/nobody-listens")
    work = clone(bare, tmp_path / "work")
    change(work, "llmgw.yaml", "stopped: false", "stopped: true", "stop")
    pushed = git(work, "push", "origin", "main", check=False)
    assert pushed.returncode == 0, pushed.stderr
    assert "could not notify the control plane" in pushed.stderr


def test_a_failed_notification_names_the_url_without_its_password(tmp_path: Path) -> None:
    bare = tmp_path / "settings.git"
    init_repository(bare, EXAMPLE, notify_url="http://hook:s3cret-token@127.0.0.1:1/nobody-listens")
    work = clone(bare, tmp_path / "work")
    change(work, "llmgw.yaml", "stopped: false", "stopped: true", "stop")
    pushed = git(work, "push", "origin", "main", check=False)
    assert pushed.returncode == 0, pushed.stderr
    assert "could not notify the control plane at http://***@127.0.0.1:1/nobody-listens" in pushed.stderr
    assert "s3cret" not in pushed.stderr


def head_of(bare: Path, ref: str) -> str | None:
    """The commit `ref` points at in `bare`, read with git itself (None: no such ref)."""
    shown = subprocess.run(["git", "rev-parse", "--verify", "-q", ref], cwd=bare, capture_output=True, text=True)
    return shown.stdout.strip() or None


@pytest.fixture
def pushed_repo(tmp_path: Path) -> tuple[Path, Path]:
    """A repository made by `init_repository` whose control plane wrote an audit commit and the applied ref,
    and a clone of it with one valid commit on main not pushed yet."""
    bare = tmp_path / "settings.git"
    seed = init_repository(bare, EXAMPLE)
    append_audit(bare, {"status.json": b"{}"}, "pass 1: converged")
    set_ref(bare, APPLIED_REF, seed)
    work = clone(bare, tmp_path / "work")
    change(work, "catalog/gemma-3-270m.yaml", "replicas: 1\n", "replicas: 2\n", "two replicas")
    return bare, work


def test_deleting_the_settings_branch_is_refused(pushed_repo: tuple[Path, Path]) -> None:
    bare, work = pushed_repo
    before = head_of(bare, "refs/heads/main")
    deleted = git(work, "push", "origin", ":main", check=False)
    assert deleted.returncode != 0
    assert "remote: refusing to delete refs/heads/main: it holds the cluster's settings" in deleted.stderr
    assert head_of(bare, "refs/heads/main") == before


@pytest.mark.parametrize("ref", [AUDIT_REF, APPLIED_REF])
def test_pushes_to_the_audit_trail_and_the_applied_ref_are_refused_and_leave_them_unchanged(
        pushed_repo: tuple[Path, Path], ref: str) -> None:
    bare, work = pushed_repo
    before = head_of(bare, ref)
    rewritten = git(work, "push", "--force", "origin", f"HEAD:{ref}", check=False)
    assert rewritten.returncode != 0
    assert (f"remote: refusing to update {ref}: this repository takes pushes to refs/heads/main only; "
            "refs/llmgw/* are the control plane's record of what it did, written by it alone") in rewritten.stderr
    deleted = git(work, "push", "origin", f":{ref}", check=False)
    assert deleted.returncode != 0 and f"remote: refusing to delete {ref}: " in deleted.stderr
    assert head_of(bare, ref) == before


@pytest.mark.parametrize("ref", ["refs/heads/proposal", "refs/tags/v1", "refs/llmgw/other", "refs/notes/commits"])
def test_a_push_to_any_ref_but_the_settings_branch_is_refused(pushed_repo: tuple[Path, Path], ref: str) -> None:
    bare, work = pushed_repo
    created = git(work, "push", "origin", f"HEAD:{ref}", check=False)
    assert created.returncode != 0
    assert f"remote: refusing to create {ref}: this repository takes pushes to refs/heads/main only" in created.stderr
    assert head_of(bare, ref) is None


def test_a_non_fast_forward_update_of_the_settings_branch_is_refused_even_when_forced(
        pushed_repo: tuple[Path, Path]) -> None:
    bare, work = pushed_repo
    assert git(work, "push", "origin", "main", check=False).returncode == 0
    pushed = head_of(bare, "refs/heads/main")
    git(work, "reset", "-q", "--hard", "HEAD~1")
    change(work, "catalog/gemma-3-270m.yaml", "replicas: 1\n", "replicas: 3\n", "three replicas instead")
    forced = git(work, "push", "--force", "origin", "main", check=False)
    assert forced.returncode != 0
    assert f"remote: refusing refs/heads/main at {head_of(work, 'HEAD')[:12]}: not a fast-forward of {pushed[:12]}" in forced.stderr
    assert head_of(bare, "refs/heads/main") == pushed


@pytest.mark.parametrize("other", [AUDIT_REF, "refs/heads/proposal", "refs/tags/v1"])
def test_a_push_of_several_refs_with_one_invalid_is_refused_whole_and_says_which(
        pushed_repo: tuple[Path, Path], other: str) -> None:
    bare, work = pushed_repo
    before = {ref: head_of(bare, ref) for ref in ("refs/heads/main", AUDIT_REF, APPLIED_REF)}
    pushed = git(work, "push", "--force", "origin", "main", f"HEAD:{other}", check=False)
    assert pushed.returncode != 0
    assert f"remote: refs/heads/main at {head_of(work, 'HEAD')[:12]}: settings valid" in pushed.stderr
    assert f"remote: refusing to {'update' if other == AUDIT_REF else 'create'} {other}: " in pushed.stderr
    assert {ref: head_of(bare, ref) for ref in before} == before
    assert other == AUDIT_REF or head_of(bare, other) is None


def test_a_push_of_several_refs_with_invalid_settings_on_the_branch_lists_the_errors(
        pushed_repo: tuple[Path, Path]) -> None:
    bare, work = pushed_repo
    change(work, "catalog/gemma-3-270m.yaml", "replicas: 2\n", "replicas: -1\n", "bad replicas")
    pushed = git(work, "push", "origin", "main", "HEAD~1:refs/tags/good", check=False)
    assert pushed.returncode != 0
    assert "remote: refusing refs/heads/main at" in pushed.stderr
    assert "catalog/gemma-3-270m.yaml:13:11: replicas: -1 is less than the minimum of 0" in pushed.stderr
    assert "remote: refusing to create refs/tags/good" in pushed.stderr
    assert head_of(bare, "refs/tags/good") is None


def test_a_repository_on_another_settings_branch_takes_pushes_to_that_branch_only(tmp_path: Path) -> None:
    bare = tmp_path / "settings.git"
    init_repository(bare, EXAMPLE, branch="production")
    assert pygit2.Repository(str(bare)).config[BRANCH_KEY] == "production"
    work = clone(bare, tmp_path / "work")
    change(work, "catalog/gemma-3-270m.yaml", "replicas: 1\n", "replicas: 2\n", "two replicas")
    refused = git(work, "push", "origin", "HEAD:refs/heads/main", check=False)
    assert refused.returncode != 0 and "takes pushes to refs/heads/production only" in refused.stderr
    accepted = git(work, "push", "origin", "HEAD:production", check=False)
    assert accepted.returncode == 0, accepted.stderr
    assert load_commit(bare, "production").models["gemma-3-270m"].replicas == 2


class _Refuser(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(403)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_control_plane_that_refuses_the_notification_is_a_warning_naming_its_answer() -> None:
    import io

    from llmgw.cli.hook_cmds import notify
    from llmgw.settings.hook import Notification

    with _serving(_Refuser) as server:
        out = io.StringIO()
        url = f"http://hook:s3cret@127.0.0.1:{server.server_address[1]}/api/v1/hooks/git"
        assert notify(Notification(url, b"{}"), out) is False
    assert out.getvalue() == (f"warning: could not notify the control plane at http://***@127.0.0.1:{server.server_address[1]}"
                              "/api/v1/hooks/git (it answered HTTP 403); it will notice the push at its next poll\n")


def test_hooks_of_an_older_llmgw_refuse_pushes_until_llmgw_repo_hooks_rewrites_them(tmp_path: Path) -> None:
    import shlex
    import sys

    from llmgw.settings.repository import _PACKAGE_ROOT

    bare = tmp_path / "settings.git"
    init_repository(bare, EXAMPLE)
    for stage in ("pre-receive", "post-receive"):  # what `llmgw repo init` wrote before llmgw.cli.hook_cmds
        (bare / "hooks" / stage).write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(_PACKAGE_ROOT))} exec "
                                            f"{shlex.quote(sys.executable)} -m llmgw.settings.hook {stage}\n")
    work = clone(bare, tmp_path / "work")
    change(work, "catalog/gemma-3-270m.yaml", "replicas: 1\n", "replicas: 2\n", "two replicas")
    refused = git(work, "push", "origin", "main", check=False)
    assert refused.returncode != 0
    assert "remote: this repository's hooks were installed by an older llmgw; rewrite them with: llmgw repo hooks" in refused.stderr
    result = CliRunner().invoke(cli, ["repo", "hooks", str(bare)])
    assert result.exit_code == 0, result.output
    accepted = git(work, "push", "origin", "main", check=False)
    assert accepted.returncode == 0 and "settings valid" in accepted.stderr, accepted.stderr


def test_llmgw_repo_hooks_refuses_a_directory_that_is_no_repository(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["repo", "hooks", str(tmp_path)])
    assert result.exit_code != 0
    assert "is not a git repository" in str(result.exception) + result.output


def test_a_forges_ci_files_in_the_settings_repository_are_not_settings(tmp_path):
    """The CI examples of examples/ci live in the settings repository: hidden entries are not read as settings,
    so the commit that adds them is accepted by the pre-receive hook, and validate says the tree is valid."""
    import shutil

    from llmgw.settings import init_repository, load_directory

    root = Path(__file__).resolve().parents[2]
    repo = tmp_path / "settings.git"
    init_repository(repo, root / "examples" / "cluster-repo")
    checkout = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(repo), str(checkout))
    for forge, target in (("github", ".github/workflows/llmgw-review.yml"), ("gitea", ".gitea/workflows/llmgw-review.yml"),
                          ("gitlab", ".gitlab-ci.yml")):
        source = next((root / "examples" / "ci" / forge).rglob("*.yml"))
        (checkout / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, checkout / target)
    load_directory(checkout)  # raises SettingsError if any of them were taken for a settings file
    git(checkout, "add", "-A")
    git(checkout, "commit", "-qm", "ci: review every pull request")
    git(checkout, "push", "-q", "origin", "HEAD:main")



class _Accepter(_Refuser):
    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(204)
        self.end_headers()


def test_a_notification_over_plain_http_loads_no_certificates(monkeypatch) -> None:
    """post-receive runs on every push: for an http URL it has no TLS to verify, so it does not load the system's CA
    bundle (0.17 s of CPU, more than the POST itself); an https URL is still verified with httpx's default trust."""
    import io
    import ssl

    import httpx

    from llmgw.cli.hook_cmds import notify
    from llmgw.settings.hook import Notification

    loaded, verified = [], []
    load_verify_locations, post = ssl.SSLContext.load_verify_locations, httpx.post

    def recording_load(self, cafile=None, capath=None, cadata=None):
        loaded.append(cafile or capath or "cadata")
        return load_verify_locations(self, cafile, capath, cadata)

    def recording_post(*args, **kwargs):
        verified.append(kwargs["verify"])
        return post(*args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", recording_load)
    monkeypatch.setattr(httpx, "post", recording_post)
    with _serving(_Accepter) as server:
        out = io.StringIO()
        url = f"127.0.0.1:{server.server_address[1]}/api/v1/hooks/git"
        assert notify(Notification(f"http://{url}", b"{}"), out)
        assert out.getvalue() == "" and loaded == [] and verified == [False]
        # the same server over https: verified as httpx does by default (and its plain-HTTP answer is no handshake)
        assert notify(Notification(f"https://{url}", b"{}"), out, timeout=5) is False
        assert verified == [False, True]
        assert out.getvalue().startswith(f"warning: could not notify the control plane at https://{url} (")

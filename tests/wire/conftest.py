"""Fixtures for the wire tests: a control plane running in another process (tests/wire/control_plane_script.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

HERE = Path(__file__).resolve().parent


@dataclass
class ControlPlaneProcess:
    """The script's process, its ports and, with mTLS, its CA directory and a fresh join token."""

    process: subprocess.Popen[str]
    port: int
    join_port: int
    ca_dir: Path | None = None
    token: str | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def join_address(self) -> str:
        return f"127.0.0.1:{self.join_port}"

    async def next_event(self, timeout: float = 10.0) -> str:
        """The next line the script prints ("closed <peer>", "cancelled <peer>"), waiting up to `timeout` s."""
        assert self.process.stdout is not None
        with trio.fail_after(timeout):
            line = await trio.to_thread.run_sync(self.process.stdout.readline, abandon_on_cancel=True)
        return line.strip()


def _start(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "control_plane_script.py"), *args], stdout=subprocess.PIPE, text=True
    )


def _ready(process: subprocess.Popen[str]) -> tuple[int, int]:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("PORT "), f"the control plane script did not start: {line!r}"
    _, port, join_port = line.split()
    return int(port), int(join_port)


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
def plain_control_plane() -> Iterator[ControlPlaneProcess]:
    """A plaintext control plane in another process."""
    process = _start([])
    try:
        port, join_port = _ready(process)
        yield ControlPlaneProcess(process, port, join_port)
    finally:
        _stop(process)


@pytest.fixture
def tls_control_plane(tmp_path: Path) -> Iterator[ControlPlaneProcess]:
    """An mTLS control plane in another process, with its CA in tmp_path/ca and one join token."""
    ca_dir, token_file = tmp_path / "ca", tmp_path / "token"
    process = _start(["--ca-dir", str(ca_dir), "--token-file", str(token_file)])
    try:
        port, join_port = _ready(process)
        yield ControlPlaneProcess(process, port, join_port, ca_dir, token_file.read_text())
    finally:
        _stop(process)


@pytest.fixture
def busy_control_plane() -> Iterator[ControlPlaneProcess]:
    """A plaintext control plane in another process whose trio loop does 50 ms of synchronous work every turn."""
    process = _start(["--busy-ms", "50"])
    try:
        port, join_port = _ready(process)
        yield ControlPlaneProcess(process, port, join_port)
    finally:
        _stop(process)

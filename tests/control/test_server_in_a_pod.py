"""What the Helm chart (deploy/helm/llmgw/) relies on in `llmgw server`, run as the chart runs it (a subprocess of
the real CLI): `--tls-hostname` puts the Service names the agents dial into the agents' and admin listeners'
certificates (a TLS client checking that name against the state's CA connects; another name is refused),
`$LLMGW_STORE` is the store (the chart passes PostgreSQL's URL from a Secret that way, never on the command line),
and options that do not fit together are refused before anything starts. About 10 s here.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from support.llmgw_processes import read_server_banner

CHECKOUT = Path(__file__).resolve().parents[2]
NAME = "r-llmgw-agents.llmgw.svc"


def _handshake(port: int, ca: Path, name: str) -> None:
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=name):
        pass


def test_tls_hostnames_name_the_listeners_and_llmgw_store_chooses_the_store(tmp_path, settings_repo) -> None:
    store = tmp_path / "elsewhere" / "store.sqlite3"
    store.parent.mkdir()
    server = subprocess.Popen(
        [sys.executable, "-m", "llmgw.cli", "server", "--repo", str(settings_repo), "--state", str(tmp_path / "state"),
         "--no-gateway", "--admin", "127.0.0.1:0", "--agents", "127.0.0.1:0", "--tls", "--tls-hostname", NAME],
        env={**os.environ, "PYTHONPATH": str(CHECKOUT), "LLMGW_STORE": f"sqlite:///{store}"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        found = read_server_banner(server)
        agents_port, admin_port = int(found["agents"][2]), int(found["admin"][2].rsplit(":", 1)[1])
        ca = tmp_path / "state" / "ca" / "ca.crt"
        for port in (agents_port, admin_port):
            _handshake(port, ca, NAME)
            _handshake(port, ca, "localhost")
            with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
                _handshake(port, ca, "other.llmgw.svc")
        assert store.stat().st_size > 0
        assert not (tmp_path / "state" / "llmgw.sqlite3").exists()
    finally:
        server.terminate()
        stopped = server.wait(timeout=30)
        server.stderr.close()
        assert stopped == 0


@pytest.mark.parametrize("options,refusal", [
    (["--tls-hostname", NAME], "--tls-hostname names the agents' certificate: give it with --tls."),
    (["--repo-ssh-key", "KEY"], "--repo-ssh-key is for an ssh settings repository (ssh://user@host/path or "
                                "user@host:path), not REPO: drop it, or give the ssh URL."),
])
def test_options_that_do_not_fit_the_rest_are_refused(tmp_path, settings_repo, options, refusal) -> None:
    key = tmp_path / "key"
    key.write_text("not read\n")
    done = subprocess.run(
        [sys.executable, "-m", "llmgw.cli", "server", "--repo", str(settings_repo), "--state", str(tmp_path / "s"),
         *[str(key) if option == "KEY" else option for option in options]],
        env={**os.environ, "PYTHONPATH": str(CHECKOUT)}, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (1, f"error: {refusal.replace('REPO', str(settings_repo))}\n")
    assert not (tmp_path / "s").exists()

"""Scripts the firewall tests run inside a lab host (tests/support/netns.py): a TCP listener and a connect probe."""

from __future__ import annotations

import subprocess
import sys
import time

from support.netns import Host

LISTEN = """
import socket, sys
server = socket.create_server(("", int(sys.argv[1])), family=socket.AF_INET6, dualstack_ipv6=True)
while True:
    conn, _ = server.accept()
    conn.close()
"""

CONNECT = """
import socket, sys, time
start = time.monotonic()
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("open")
except ConnectionRefusedError:
    print(f"refused {time.monotonic() - start:.3f}")
except OSError as exc:
    print(f"failed {type(exc).__name__}")
"""


def listen(host: Host, port: int) -> subprocess.Popen:
    """A listener on every address of `host` at `port` (IPv4 and IPv6), accepting and closing; waits until it is up."""
    process = host.popen([sys.executable, "-c", LISTEN, str(port)])
    deadline = time.monotonic() + 10
    while connect(host, "127.0.0.1", port) != "open":
        assert time.monotonic() < deadline and process.poll() is None, "the listener did not start"
        time.sleep(0.05)
    return process


def connect(host: Host, address: str, port: int, timeout: float = 3.0) -> str:
    """From `host`: "open", "refused <seconds>" or "failed <error>" for a new TCP connection to address:port."""
    return host.run([sys.executable, "-c", CONNECT, address, str(port), str(timeout)]).stdout.strip()

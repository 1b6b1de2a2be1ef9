"""A stand-in for perftest's `ib_write_bw` on a machine without RDMA devices (`llmgw fabric-test` tests).

Called as the real tool is, `ib_write_bw -d ADAPTER -p PORT [SERVER]`: without SERVER it listens on TCP PORT, serves
one client and exits (as perftest's server does); with SERVER it connects once to SERVER:PORT (so a wrong address
or port fails the run, "Couldn't connect to SERVER:PORT", as perftest says it) and prints the hand-made table of
tests/fixtures/hand-made for its adapter: mlx5_0 a healthy 196 Gb/s (perftest-write-bw-gbits.txt), mlx5_1 half its
rate (perftest-write-bw-mib-degraded.txt); any other adapter is "not found" (exit 1). Each call's argv is written to $FAKE_PERFTEST_RECORDS/<n>.json.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hand-made"
TABLES = {"mlx5_0": "perftest-write-bw-gbits.txt", "mlx5_1": "perftest-write-bw-mib-degraded.txt"}


def main(argv: list[str]) -> int:
    records = Path(os.environ["FAKE_PERFTEST_RECORDS"])
    records.mkdir(parents=True, exist_ok=True)
    (records / f"{time.monotonic_ns()}-{os.getpid()}.json").write_text(json.dumps(argv))
    options, rest = {}, list(argv)
    while rest and rest[0].startswith("-"):
        name = rest.pop(0)
        options[name] = rest.pop(0)
    device, port = options["-d"], int(options["-p"])
    if device not in TABLES:  # as perftest says it of a device the machine lacks
        print(f"IB device {device} not found\n Unable to find the Infiniband/RoCE device", file=sys.stderr)
        return 1
    if not rest:  # the server: one client, then exit
        with socket.create_server(("0.0.0.0", port), reuse_port=False) as server:
            server.settimeout(30)
            connection, _ = server.accept()
            with connection:
                connection.sendall(device.encode() + b"\n")
                connection.recv(64)
        return 0
    try:
        with socket.create_connection((rest[0], port), timeout=5) as connection:
            connection.recv(64)
            connection.sendall(b"done\n")
    except OSError:
        print(f" Couldn't connect to {rest[0]}:{port}", file=sys.stderr)
        return 1
    sys.stdout.write((FIXTURES / TABLES[device]).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Engine relay: the latency the agent's relay (`llmgw.engines.relay`) adds to a request and to a streamed event.

    .venv/bin/python bench/engine_relay.py [--requests 2000] [--events 2000] [--gap-ms 0.5]

Three processes, as on a node: the relay process as the agent starts it (`llmgw.engines.relay.relay_command`,
`python -P -m llmgw.engines.relay --listen ... -- ENGINE`), the engine stand-in as its child, and this client. The engine stand-in is a plain blocking HTTP/1.1 server (one thread per connection, keep-alive):
any request is answered with a small JSON body (Content-Length); `GET /stream?n=N` with N server-sent events in
chunked coding, one chunk per event, `gap-ms` apart (so events do not merge into one read), each carrying the
engine's CLOCK_MONOTONIC in nanoseconds when it was written. The client uses one keep-alive connection per path and
blocking sockets, and sends every request with the replica key.

Figures, both paths measured in the same run, interleaved (request i goes direct then relayed, or the other way
round, alternating, so other work on the machine hits both alike):
- per request: the time from sending a small POST to having its whole answer, p50 and p90 per path, and the
  added p50 (relay p50 - direct p50; target < 0.2 ms, issue 25);
- per event: for each event, the time from the engine writing it to the client having read it, p50 per path over
  `events` events of one stream per path, and the added p50 (target < 20 µs).
The relay is the agent's code unchanged; its process runs nothing else. Also printed: the relay process's CPU
time per request and per event (/proc/PID/task/*/schedstat), which depends less on other load than latencies do.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEY = "bench-relay-key"
BODY = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 1}).encode()
ANSWER = json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [{"text": " world"}]}).encode()


# ------------------------------------------------------------------------------------------- the engine stand-in
def _read_head(conn: socket.socket, buffer: bytearray) -> bytes | None:
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        data = conn.recv(65536)
        if not data:
            return None
        buffer += data
    head = bytes(buffer[:end + 4])
    del buffer[:end + 4]
    return head


def _serve_engine_connection(conn: socket.socket, gap: float) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray()
    with conn:
        while (head := _read_head(conn, buffer)) is not None:
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buffer) < length:
                buffer += conn.recv(65536)
            del buffer[:length]
            target = head.split(b" ", 2)[1]
            if target.startswith(b"/stream"):
                count = int(target.rsplit(b"=", 1)[1])
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                for _ in range(count):
                    time.sleep(gap)
                    event = b'data: {"t": %d}\n\n' % time.monotonic_ns()
                    conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
                conn.sendall(b"0\r\n\r\n")
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(ANSWER), ANSWER))


def run_engine(port: int, gap: float) -> None:
    server = socket.create_server(("127.0.0.1", port))
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_serve_engine_connection, args=(conn, gap), daemon=True).start()


# ------------------------------------------------------------------------------------------- the client
class Client:
    """One blocking keep-alive connection."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = bytearray()

    def _head(self) -> tuple[int, bytes]:
        head = _read_head(self.sock, self.buffer)
        assert head is not None, "the connection closed"
        status = int(head.split(b" ", 2)[1])
        return status, head

    def request(self) -> float:
        """Seconds from sending a small POST to having its whole answer."""
        began = time.perf_counter()
        self.sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: engine\r\nAuthorization: Bearer " + KEY.encode()
                          + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
        status, head = self._head()
        assert status == 200, head
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(self.buffer) < length:
            self.buffer += self.sock.recv(65536)
        del self.buffer[:length]
        return time.perf_counter() - began

    def stream(self, count: int) -> list[float]:
        """Per event, seconds from the engine writing it to this client having read it."""
        self.sock.sendall(b"GET /stream?n=%d HTTP/1.1\r\nHost: engine\r\nAuthorization: Bearer %s\r\n\r\n"
                          % (count, KEY.encode()))
        status, head = self._head()
        assert status == 200, head
        delays: list[float] = []
        now = time.monotonic_ns()  # for event bytes that came with the head
        while True:
            while (size_end := self.buffer.find(b"\r\n")) >= 0:
                size = int(self.buffer[:size_end], 16)
                total = size_end + 2 + size + 2
                if len(self.buffer) < total:
                    break
                event = bytes(self.buffer[size_end + 2:size_end + 2 + size])
                del self.buffer[:total]
                if size == 0:
                    return delays
                delays.append((now - json.loads(event[6:])["t"]) / 1e9)
            data = self.sock.recv(65536)
            now = time.monotonic_ns()
            assert data, "the stream ended early"
            self.buffer += data


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _cpu_ns(pid: int) -> int:
    """The nanoseconds process `pid`'s threads ran on a CPU so far (the first field of /proc/PID/schedstat)."""
    return sum(int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
               for task in os.listdir(f"/proc/{pid}/task"))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--gap-ms", type=float, default=0.5)
    args = parser.parse_args()
    engine_port, relay_port = _free_port(), _free_port()
    sys.path.insert(0, str(ROOT))
    from llmgw.engines.relay import relay_command

    argv = relay_command(sys.executable, "127.0.0.1", relay_port, engine_port, "BENCH_RELAY_KEY",
                         [sys.executable, __file__, "engine", str(engine_port), str(args.gap_ms / 1000)])
    env = {**os.environ, "BENCH_RELAY_KEY": KEY, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    relay = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    assert relay.stdout.readline().strip() == "ready"  # the engine's line: the relay listens before it starts
    try:
        direct, relayed = Client(engine_port), Client(relay_port)
        for _ in range(200):  # warm-up
            direct.request(), relayed.request()
        times: dict[str, list[float]] = {"direct": [], "relay": []}
        cpu_before = _cpu_ns(relay.pid)
        for i in range(args.requests):
            order = [("direct", direct), ("relay", relayed)]
            for name, client in order if i % 2 else order[::-1]:
                times[name].append(client.request())
        cpu_request = (_cpu_ns(relay.pid) - cpu_before) / args.requests / 1e3
        events = {"direct": direct.stream(args.events)}
        cpu_before = _cpu_ns(relay.pid)
        events["relay"] = relayed.stream(args.events)
        cpu_event = (_cpu_ns(relay.pid) - cpu_before) / args.events / 1e3
    finally:
        os.killpg(relay.pid, signal.SIGKILL)
    cpus = os.cpu_count()
    print(f"engine relay, {args.requests} requests and {args.events} events per path, {cpus} CPUs, load "
          f"{os.getloadavg()[0]:.2f}")
    for name in ("direct", "relay"):
        print(f"  request  {name:6s}  p50 {_pct(times[name], 0.5) * 1e3:7.3f} ms  p90 {_pct(times[name], 0.9) * 1e3:7.3f} ms")
    added = (_pct(times["relay"], 0.5) - _pct(times["direct"], 0.5)) * 1e3
    print(f"  request  added p50 {added:.3f} ms (target < 0.2 ms): {'met' if added < 0.2 else 'NOT met'}")
    print(f"  request  relay CPU {cpu_request:.1f} µs per request (its process, /proc/PID/schedstat)")
    event_direct = statistics.median(events["direct"]) * 1e6
    event_relay = statistics.median(events["relay"]) * 1e6
    print(f"  event    direct  p50 {event_direct:7.1f} µs   relay p50 {event_relay:7.1f} µs")
    added_event = event_relay - event_direct
    print(f"  event    added p50 {added_event:.1f} µs (target < 20 µs): {'met' if added_event < 20 else 'NOT met'}")
    print(f"  event    relay CPU {cpu_event:.1f} µs per event")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "engine":
        run_engine(int(sys.argv[2]), float(sys.argv[3]))
    else:
        main()

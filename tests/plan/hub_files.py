"""A local stand-in of the Hugging Face Hub on 127.0.0.1 (port 0) serving real files from disk, counting the bytes
it sends of each: the paths llmgw's weights fetcher uses (`llmgw.agent.weights.hub_url`,
`llmgw.agent.weights_tree.tree_url`).

- `GET /api/models/<org>/<repo>/tree/<revision>[/<dir>]?recursive=true`: the tree API's entries (huggingface_hub's
  `RepoFile`): `{"type": "file", "path", "size", "oid", "lfs": {"oid", "size", "pointerSize"}}` (no `lfs` for a
  file kept in git) and `{"type": "directory", "path"}`.
- `GET /<org>/<repo>/resolve/<revision>/<path>`: a file kept in git is answered here; an LFS file is a 302 to
  `/cdn/<sha256>` (the Hub's redirect to its CDN), which honours `Range: bytes=A-B` / `bytes=A-` with 206 and
  Content-Range, as the CDN does.

`served[path]` counts the body bytes sent of each file (path in its repository).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlsplit

from support.http_stub import StubHandler

from llmgw.engines.downloading import sha256_file


class HubFiles:
    """The stand-in. `add(repo, path, file, sha256=None)`: `file` on disk served as `path` of `repo` at revision
    `main` and `revision`; `sha256` None keeps it in git (its digests computed; small files only)."""

    def __init__(self, revision: str = "c" * 40) -> None:
        self.revision = revision
        self.files: dict[tuple[str, str], tuple[Path, str | None]] = {}
        self.served: Counter[str] = Counter()
        self.lock = threading.Lock()
        hub = self

        class Handler(StubHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                path = unquote(urlsplit(self.path).path)
                tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)/?(.*)", path)
                if tree:
                    entries = hub.tree(tree[1], tree[2], tree[3])
                    self._send(200 if entries else 404, json.dumps(entries).encode(),
                               {"Content-Type": "application/json"})
                    return
                resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if resolve and resolve[2] in ("main", hub.revision) and (resolve[1], resolve[3]) in hub.files:
                    file, sha256 = hub.files[(resolve[1], resolve[3])]
                    if sha256 is None:
                        self._body(file, resolve[3])
                    else:
                        self._send(302, headers={"Location": f"/cdn/{sha256}", "X-Linked-Etag": f'"{sha256}"'})
                    return
                cdn = re.fullmatch(r"/cdn/([0-9a-f]{64})", path)
                found = [(p, f) for (_, p), (f, d) in hub.files.items() if cdn and d == cdn[1]]
                if found:
                    self._body(found[0][1], found[0][0])
                    return
                self._send(404, b'{"error":"Entry not found"}')

            def _body(self, file: Path, name: str) -> None:
                size = file.stat().st_size
                start, end = 0, size - 1
                wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                if wanted:
                    start, end = int(wanted[1]), min(int(wanted[2]) if wanted[2] else size - 1, size - 1)
                    if start >= size:
                        self._send(416, headers={"Content-Range": f"bytes */{size}"})
                        return
                with file.open("rb") as handle:
                    handle.seek(start)
                    body = handle.read(end - start + 1)
                with hub.lock:
                    hub.served[name] += len(body)
                self._send(206 if wanted else 200, body,
                           {"Accept-Ranges": "bytes", **({"Content-Range": f"bytes {start}-{end}/{size}"}
                                                         if wanted else {})})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def add(self, repo: str, path: str, file: Path, sha256: str | None = None) -> None:
        self.files[(repo, path)] = (Path(file), sha256)

    def tree(self, repo: str, revision: str, folder: str) -> list[dict]:
        if revision not in ("main", self.revision):
            return []
        prefix = f"{folder.rstrip('/')}/" if folder else ""
        entries: dict[str, dict] = {}
        for (r, path), (file, sha256) in self.files.items():
            if r != repo or not path.startswith(prefix):
                continue
            parts = path.split("/")
            for depth in range(1, len(parts)):
                entries["/".join(parts[:depth])] = {"type": "directory", "oid": "d" * 40, "size": 0,
                                                    "path": "/".join(parts[:depth])}
            size = file.stat().st_size
            entry = {"type": "file", "path": path, "size": size}
            if sha256 is None:
                content = file.read_bytes()
                entry["oid"] = hashlib.sha1(b"blob %d\0" % size + content).hexdigest()  # noqa: S324 - git's id
            else:
                entry["oid"] = "e" * 40
                entry["lfs"] = {"oid": sha256, "size": size, "pointerSize": 134}
            entries[path] = entry
        return [entries[p] for p in sorted(entries)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_directory(repo: str, directory: Path, revision: str = "c" * 40) -> HubFiles:
    """A stand-in serving every file of `directory` as `repo` at `revision`: `*.json` files other than
    `tokenizer.json` kept in git, the rest in LFS (their sha256 computed), as the Hub keeps a model's files."""
    server = HubFiles(revision)
    for file in sorted(p for p in Path(directory).iterdir() if p.is_file()):
        in_git = file.suffix == ".json" and file.name != "tokenizer.json"
        server.add(repo, file.name, file, None if in_git else sha256_file(file))
    return server

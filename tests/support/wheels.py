"""Tiny pure-Python wheels in a local PEP 503 package index, standing in for PyPI and other indexes in tests."""

from __future__ import annotations

import base64
import hashlib
import functools
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def wheel(index: Path, name: str, version: str, requires: tuple[str, ...] = (), body: str = "") -> Path:
    """A pure-Python wheel `name` (module of the same name) in the PEP 503 index at `index`, with its page."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}"
    files = {f"{module}/__init__.py": f"__version__ = {version!r}\n{body}",
             f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n"
             + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(c.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(c.encode())}\n" for p, c in files.items()) + f"{dist}.dist-info/RECORD,,\n"
    folder = index / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, content in {**files, f"{dist}.dist-info/RECORD": record}.items():
            archive.writestr(member, content)
    links = "".join(f'<a href="{p.name}">{p.name}</a>\n' for p in sorted(folder.glob("*.whl")))
    (folder / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return path


# The body of a stand-in `torch` wheel: just what python_env's install check runs (ones, @, sum).
TORCH_STANDIN = '''
class Tensor:
    def __init__(self, rows):
        self.rows = rows
    def __matmul__(self, other):
        return Tensor([[sum(a * b for a, b in zip(r, c)) for c in zip(*other.rows)] for r in self.rows])
    def sum(self):
        return sum(map(sum, self.rows))
def ones(n, m):
    return Tensor([[1.0] * m for _ in range(n)])
'''


def serve(root: Path) -> tuple[ThreadingHTTPServer, str, list[str]]:
    """`root` served over loopback HTTP; returns the server, its URL and the list of paths asked for."""
    asked: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            asked.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/", asked

"""A reader of `ttar` text archives (prometheus/procfs's `ttar` script), for the sysfs trees of tests/fixtures.

The format, as the script writes it: entries separated by a line `# ttar - - - ...`; each entry is one of
`Directory: PATH` + `Mode: 755`, `Path: PATH` + `SymlinkTo: TARGET`, or `Path: PATH` + `Lines: N` + N lines of
content + `Mode: 644`. A content line ending in a bare `EOF` had no newline in the file; `\\EOF` is a literal
`EOF` and `NULLBYTE` a zero byte. Lines starting with `#` outside content are comments.

`entries(text)` gives the entries in order with their text as written; `select(text, prefixes)` keeps the entries
under some prefix (how the fixtures' excerpts were cut); `extract(text, root)` writes the tree under `root` with its
symbolic links and modes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SEPARATOR = "# ttar - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - -"


@dataclass(frozen=True)
class Entry:
    """One archive entry: `kind` "dir", "file" or "link"; `content` a file's bytes; `target` a link's target."""

    kind: str
    path: str
    mode: int | None = None
    content: bytes = b""
    target: str = ""
    text: str = ""   # the entry as written in the archive, without its separator line


def _unescape(line: str) -> tuple[bytes, bool]:
    """A content line's bytes and whether it ended with a newline."""
    newline = not re.search(r"(^|[^\\])EOF$", line)
    if not newline:
        line = line[:-3]
    line = re.sub(r"(^|[^\\])NULLBYTE", lambda m: m.group(1) + "\x00", line)
    line = line.replace("\\NULLBYTE", "NULLBYTE").replace("\\EOF", "EOF")
    return line.encode("utf-8", "surrogateescape"), newline


def entries(text: str) -> list[Entry]:
    """Every entry of the archive `text`, in order. Raises ValueError naming the line on a malformed entry."""
    lines = text.split("\n")
    out: list[Entry] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        start = i
        if not line or line.startswith("#"):
            i += 1
            continue
        if line.startswith("Directory: "):
            path = line[len("Directory: "):]
            mode = int(lines[i + 1].split(": ", 1)[1], 8) if lines[i + 1].startswith("Mode: ") else None
            i += 2 if mode is not None else 1
            out.append(Entry("dir", path, mode, text="\n".join(lines[start:i])))
            continue
        if not line.startswith("Path: "):
            raise ValueError(f"ttar line {i + 1}: expected Path: or Directory:, got {line!r}")
        path = line[len("Path: "):]
        nxt = lines[i + 1]
        if nxt.startswith("SymlinkTo: "):
            i += 2
            out.append(Entry("link", path, target=nxt[len("SymlinkTo: "):], text="\n".join(lines[start:i])))
            continue
        if not nxt.startswith("Lines: "):
            raise ValueError(f"ttar line {i + 2}: expected Lines: or SymlinkTo:, got {nxt!r}")
        count = int(nxt[len("Lines: "):])
        content = b""
        for body in lines[i + 2:i + 2 + count]:
            data, newline = _unescape(body)
            content += data + (b"\n" if newline else b"")
        i += 2 + count
        mode = None
        if i < len(lines) and lines[i].startswith("Mode: "):
            mode = int(lines[i].split(": ", 1)[1], 8)
            i += 1
        out.append(Entry("file", path, mode, content, text="\n".join(lines[start:i])))
    return out


def select(text: str, prefixes: tuple[str, ...], header: str = "") -> str:
    """An archive of the entries of `text` whose path is one of `prefixes` or lies under one, as written there."""
    def wanted(path: str) -> bool:
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in prefixes)

    kept = [e.text for e in entries(text) if wanted(e.path)]
    return "".join(f"{header}\n" if header else "") + "".join(f"{body}\n{SEPARATOR}\n" for body in kept)


def extract(text: str, root: Path) -> Path:
    """Write the archive's tree under `root` (directories made as needed, links as symbolic links); returns root."""
    for entry in entries(text):
        target = root / entry.path
        if entry.kind == "dir":
            target.mkdir(parents=True, exist_ok=True)
        elif entry.kind == "link":
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(entry.target.rstrip("/"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(entry.content)
            if entry.mode is not None:
                target.chmod(entry.mode)
    return root


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def extract_fixture(relative: str, root: Path) -> Path:
    """Extract tests/fixtures/`relative` (a ttar excerpt, see tests/fixtures/README.md) under `root`; returns root."""
    data = (FIXTURES / relative).read_bytes().decode("utf-8", "surrogateescape")
    return extract(data, root)

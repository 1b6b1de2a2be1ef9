"""Recognising pickles by their content, whatever the file is called: `pickle_format(path)`. Pure but for reading
the file's first 64 KiB (and a zip's central directory).

A weights file that is a pickle runs code when an engine loads it (PyTorch's `torch.load`, joblib, `pickle.load`),
so `llmgw.agent.weights` refuses one unless the model sets `allow_pickle`. Pickles of protocols 2 to 5 start with
the PROTO opcode (0x80); protocols 0 and 1 have none and start with text opcodes (`c` GLOBAL, `(` MARK, `}`...),
so they are read opcode by opcode with the stack and memo the unpickler keeps. GGUF, safetensors and JSON never
match. Format: the opcodes of the standard library's `pickletools` (PEP 307, PEP 3154, PEP 574); PyTorch's
checkpoint layout (`torch.save`: a zip holding `<top>/data.pkl`).
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from pathlib import Path

_SNIFF_BYTES = 64 * 1024


class _Exhausted(Exception):
    """The bytes read ran out inside an opcode: the pickle goes on past them (or was cut short)."""


class _Head:
    """The first bytes of a file as pickletools reads them, raising _Exhausted instead of reading short."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise _Exhausted
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def readline(self) -> bytes:
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            raise _Exhausted
        line = self.data[self.pos:end + 1]
        self.pos = end + 1
        return line

    def tell(self) -> int:
        return self.pos


_MARK = pickletools.markobject
_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"})
_MEMO_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_IMPORTS = frozenset({"GLOBAL", "INST"})


def _importable(arg: object) -> bool:
    """Whether a GLOBAL/INST argument ("module name") names something the unpickler could import."""
    parts = str(arg).split(" ")
    return len(parts) == 2 and all(word.isidentifier() for part in parts for word in part.split("."))


def _scan(head: bytes) -> tuple[int, str, bool, int]:
    """Read `head` as pickle opcodes, keeping the stack the unpickler would (depth and marks, as pickletools.dis
    checks it): (opcodes that parse, how it ended: "stop" (a STOP leaving one object), "end" (the bytes ran out
    inside the pickle) or "bad" (an unknown opcode, a bad argument, a stack or memo the unpickler would refuse), whether
    an opcode before the end imports a module by name (GLOBAL, INST), the highest protocol of the opcodes seen).
    A file starting with PROTO takes that protocol's opcodes; one without takes those of protocols 0 and 1 only.
    An opcode whose argument runs past `head` counts as one that parses."""
    reader = _Head(head)
    depth, marks, count, imports, done = 0, [], 0, False, 0
    memo: set[object] = set()
    proto = head[1] if head[:1] == b"\x80" and len(head) > 1 else 1
    highest = 0
    try:
        for opcode, arg, _pos in pickletools.genops(reader):
            if opcode.proto > proto:
                return count, "bad", imports, highest
            before, after = opcode.stack_before, opcode.stack_after
            floor = marks[-1] if marks else 0
            if opcode.name in _MEMO_PUTS:  # something to store, in a slot not stored before
                key = len(memo) if opcode.name == "MEMOIZE" else arg
                if depth <= floor or key in memo:
                    return count, "bad", imports, highest
                memo.add(key)
            elif opcode.name in _MEMO_GETS and arg not in memo:
                return count, "bad", imports, highest
            if _MARK in before:
                if not marks:
                    return count, "bad", imports, highest
                depth = marks.pop() - before.index(_MARK)
                floor = marks[-1] if marks else 0
            elif opcode.name == "POP" and marks and depth == floor:
                marks.pop()  # protocol 0's POP of a MARK
                floor = marks[-1] if marks else 0
            else:
                depth -= len(before)
            if depth < floor:
                return count, "bad", imports, highest
            if _MARK in after:
                marks.append(depth)
            else:
                depth += len(after)
            count += 1
            done = reader.pos
            highest = max(highest, opcode.proto)
            imports = imports or (opcode.name in _IMPORTS and _importable(arg))
            if opcode.name == "STOP":
                return count, ("stop" if depth == 0 and not marks else "bad"), imports, highest
    except _Exhausted:  # an opcode whose argument runs past the bytes still counts (its byte was read)
        return count + (reader.pos > done), "end", imports, highest
    except ValueError:  # an unknown opcode or an argument that does not parse
        return count, "bad", imports, highest
    return count, "end", imports, highest


_WHOLE_OPCODES = 5
"""The fewest opcodes of a whole pickle of protocol 0 or 1 without imports that counts as one (shorter ones begin
other formats: a safetensors header length whose first byte is `T`, `X` or `U` runs into JSON as a 3-opcode pickle)."""
_LONG_OPCODES = 64
"""The fewest opcodes that parse before the first bytes of a file run out, for a protocol 0 or 1 pickle without
imports that is longer than them."""


def _pickle_protocol(head: bytes) -> int | None:
    """The protocol of the pickle `head` starts, or None when it is none; `head` is a file's first bytes.

    - Protocols 2 to 5 start with PROTO (0x80, then 2..5): a pickle when three opcodes follow that parse (joblib and
      PyTorch's legacy format put raw bytes after a pickle), when it is whole (STOP) after two, or when it imports.
    - Protocols 0 and 1 have no PROTO opcode; only their own opcodes are read (text opcodes such as `c`, `(`, `S`,
      `.`; protocol 1's `}`, `q`, `K`...), with the stack and memo the unpickler keeps (as `pickletools.dis`
      checks them). A pickle: one that imports a module by name (GLOBAL `c`, INST `i`: the only way such a pickle
      runs code), even when it is longer than `head`, cut short or followed by bad bytes (the unpickler imports,
      and may call, before it gets there); a whole one of _WHOLE_OPCODES opcodes or more; one of _LONG_OPCODES or
      more that is longer than `head`.
    Not recognised, and harmless (no imports): pickles of plain data shorter than that (`I1\n.`, `).`, one long
    string). JSON (`{`, `[`), GGUF (`GGUF`, checked first) and safetensors (a u64 length, then `{"`) are never
    pickles. Format: the opcodes of the standard library's `pickletools` (PEP 307, PEP 3154, PEP 574)."""
    if head[:4] == b"GGUF":
        return None
    count, ended, imports, highest = _scan(head)
    if head[:1] == b"\x80":
        protocol = head[1] if len(head) > 1 and 2 <= head[1] <= 5 else None
        if protocol is not None and (count >= 4 or (ended == "stop" and count >= 3) or imports):
            return protocol
        return None
    if imports or (ended == "stop" and count >= _WHOLE_OPCODES) or (ended == "end" and count >= _LONG_OPCODES):
        return min(1, highest)
    return None


def pickle_format(path: Path) -> str | None:
    """What kind of pickle the file at `path` is, judged by its content, or None when it is none.

    "a pickle (protocol N)" for a pickle of any protocol, 0 to 5 (`_pickle_protocol`: raw pickles, joblib files,
    PyTorch's legacy format; protocols 0 and 1 have no PROTO opcode and N is then the highest opcode's protocol); "a PyTorch checkpoint (zip holding NAME)" for a zip with a `data.pkl` member (torch.save's
    layout, `archive/data.pkl`). Reads the first 64 KiB and, for a zip, its central directory. Blocking.
    Raises OSError when the file cannot be read.
    """
    with path.open("rb") as handle:
        head = handle.read(_SNIFF_BYTES)
    if head[:4] == b"GGUF":
        return None
    protocol = _pickle_protocol(head)
    if protocol is not None:
        return f"a pickle (protocol {protocol})"
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError, ValueError):
            return None
        for name in names:
            if name == "data.pkl" or name.endswith("/data.pkl"):
                return f"a PyTorch checkpoint (zip holding {name})"
    return None

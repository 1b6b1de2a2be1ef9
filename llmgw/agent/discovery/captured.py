"""A directory of captured tool output, read in place of running the tools (`llmgw node doctor --from DIR`).

`CaptureDir(root)` answers the two things discovery and the health reading ask of a node: `run(argv)` (the
`Runner` of `llmgw.agent.discovery.node`) and the fabric source (`fabrics()`, `node_guid_text(ca)`, as
`SysfsFabrics`). Each command the agent runs maps to one file name (`CAPTURE_FILES`, the names of
tests/fixtures/nvidia-h200/; the layout is documented in docs/doctor-captures.md). A file may carry the frame of
those captures, a first line "# $ command" and a last line "# exit=N": N is the tool's exit status, and 127 (the
shell's "command not found") means the tool was not installed on the captured node. Without a frame the exit
status is 0.

A missing file means "not captured": `run` answers None (as for a tool that is not installed) and the file is
listed in `not_captured`. A file that exists but cannot be read (permissions, a directory, not UTF-8) raises
`CaptureError` naming it. InfiniBand ports come from `ibstat.txt` (the live agent reads sysfs; ibstat prints the
same fields), IMEX counts as configured when `nvidia-imex-ctl-N-j.json` was captured.
"""

from __future__ import annotations

import re
from pathlib import Path

from llmgw.agent.discovery.fabrics import Fabrics
from llmgw.agent.discovery.node import ToolOutput
from llmgw.errors import UsageError
from llmgw.tools import IbPort, ParseError, command_body, parse_ibstat

NOT_INSTALLED = 127
"""The exit status a shell gives a command it cannot find: the tool was not installed on the captured node."""

CAPTURE_FILES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("nvidia-smi", "-q", "-x"): ("nvidia-smi-q-x.xml",),
    ("nvidia-smi", "-L"): ("nvidia-smi-L.txt",),
    ("nvidia-smi", "topo", "-m"): ("nvidia-smi-topo-m.txt",),
    ("nvidia-smi", "nvlink", "-e"): ("nvidia-smi-nvlink-e.txt",),
    ("journalctl",): ("journalctl-k.txt",),
    ("dmesg",): ("dmesg-xid.txt", "dmesg.txt"),
    ("nvidia-imex-ctl",): ("nvidia-imex-ctl-N-j.json",),
    ("saquery", "SMIR"): ("saquery-smir-{ca}-{port}.txt", "saquery-smir.txt"),
    ("sminfo",): ("sminfo-{ca}-{port}.txt", "sminfo.txt"),
    ("ibnetdiscover",): ("ibnetdiscover.txt",),
}
"""argv prefix -> the files that answer it, first found wins; "{ca}" and "{port}" are the `-C`/`-P` arguments."""

OTHER_FILES = ("ibstat.txt", "lspci-vv.txt", "hostname.txt", "uname.txt", "proc-meminfo.txt")
"""Files read other than through `run`: ibstat for the ports, the rest kept for a person reading a support case
(`lspci-vv.txt`: LnkCap/LnkSta, which the PCIe warnings point at) or for the node's name and memory."""

_EXIT = re.compile(r"^# exit=(-?\d+)\s*$")


class CaptureError(UsageError):
    """A capture directory or one of its files cannot be read; the message names it."""


def _argument(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else ""


class CaptureDir:
    """Captured tool output under `root` (see the module docstring). Raises `CaptureError` when `root` is not a
    directory. `not_captured` lists, in first-asked order, the files a question found missing."""

    def __init__(self, root: Path):
        self.root = Path(root)
        if not self.root.is_dir():
            raise CaptureError(f"{self.root} is not a directory of captured tool output (see docs/doctor-captures.md)")
        self.not_captured: list[str] = []
        self._ports: tuple[IbPort, ...] | None = None

    def read(self, name: str, *, quiet: bool = False) -> tuple[str, int] | None:
        """(the tool's output without the capture frame, its exit status) of file `name`; None when it is absent
        (recorded in `not_captured` unless `quiet`). Raises `CaptureError` naming the file when it cannot be
        read."""
        path = self.root / name
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            if not quiet and name not in self.not_captured:
                self.not_captured.append(name)
            return None
        except OSError as exc:
            raise CaptureError(f"{path} cannot be read: {exc.strerror or exc}") from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CaptureError(f"{path} is not UTF-8 text (byte {exc.start}): capture the tool's output as text")
        lines = text.rstrip("\n").splitlines()
        exit_code = 0
        if lines:
            match = _EXIT.match(lines[-1])
            if match:
                exit_code = int(match.group(1))
        return command_body(text), exit_code

    def captured(self) -> tuple[str, ...]:
        """The names of the files in `root` that the layout knows (`CAPTURE_FILES`, per-port ones included, and
        `OTHER_FILES`), sorted; empty when the directory holds no capture at all. Blocking (lists `root`)."""
        patterns = [name.format(ca="*", port="*") for names in CAPTURE_FILES.values() for name in names]
        patterns += OTHER_FILES
        return tuple(sorted({path.name for pattern in patterns for path in self.root.glob(pattern)}))

    def files_for(self, argv: list[str]) -> tuple[str, ...]:
        """The file names that may answer `argv` (empty: no capture answers that command)."""
        for prefix, names in CAPTURE_FILES.items():
            if tuple(argv[:len(prefix)]) == prefix:
                ca, port = _argument(argv, "-C"), _argument(argv, "-P")
                return tuple(n.format(ca=ca, port=port) for n in names if ca or "{ca}" not in n)
        return ()

    def run(self, argv: list[str]) -> ToolOutput | None:
        """The captured answer to `argv`: None when no file answers it (not captured; the first candidate is
        listed in `not_captured`) or its exit status is 127 (not installed). Raises `CaptureError`."""
        names = self.files_for(argv)
        for name in names:
            found = self.read(name, quiet=True)
            if found is not None:
                text, exit_code = found
                return None if exit_code == NOT_INSTALLED else ToolOutput(tuple(argv), exit_code, text)
        if names and names[-1] not in self.not_captured:  # the general name: a per-port one is optional
            self.not_captured.append(names[-1])
        return None

    def ports(self) -> tuple[IbPort, ...]:
        """InfiniBand/RoCE ports of `ibstat.txt` (none when absent, not installed or failed). Raises
        `CaptureError` when ibstat's output does not parse."""
        if self._ports is None:
            found = self.read("ibstat.txt")
            ports: tuple[IbPort, ...] = ()
            if found is not None and found[1] == 0:
                try:
                    ports = parse_ibstat(found[0])
                except ParseError as exc:
                    raise CaptureError(f"{self.root / 'ibstat.txt'}: {exc}") from exc
            self._ports = ports
        return self._ports

    def fabrics(self) -> Fabrics:
        """The ports of `ibstat.txt`, and IMEX configured when its `nvidia-imex-ctl` output was captured."""
        return Fabrics(infiniband=self.ports(), imex=(self.root / "nvidia-imex-ctl-N-j.json").is_file())

    def node_guid_text(self, ca: str) -> str:
        """Adapter `ca`'s node GUID as sysfs writes it (16 hex digits), from ibstat's "Node GUID: 0x..."; ""
        when unknown."""
        for port in self.ports():
            if port.ca == ca and port.node_guid:
                digits = port.node_guid.lower().removeprefix("0x")
                return digits.rjust(16, "0") if len(digits) <= 16 else ""
        return ""

    def hostname(self) -> str:
        """The captured node's name: `hostname.txt`, else the second word of `uname.txt` (`uname -a`); ""."""
        for name, word in (("hostname.txt", 0), ("uname.txt", 1)):
            found = self.read(name, quiet=True)
            if found is not None and found[1] == 0:
                words = found[0].split()
                if len(words) > word:
                    return words[word]
        return ""

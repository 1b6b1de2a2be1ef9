"""`nvidia-smi nvlink -s` (each NVLink's speed) and `nvidia-smi nvlink -e` (each link's error counters). Pure.

Both print a "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-...)" line per card and indented link lines below it:
`-s` "Link 0: 25 GB/s" (A100, gpud's testdata), "Link 0: 26.562 GB/s" (H100, driver 590, nvidia_gpu_exporter's
captures) or "Link 3: <inactive>"; `-e` three lines per link, "Link 0: Replay Errors: 0", "Link 0: Recovery
Errors: 0", "Link 0: CRC Errors: 0" (stas00/ml-engineering, H100); newer drivers add more counters in the same
"Link N: Name: value" shape, so counters are kept by their printed name. A card without NVLink prints nothing
(tests/fixtures/nvidia-h200/nvidia-smi-nvlink-*.txt). Sources of each capture: tests/fixtures/nvlink/README.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from llmgw.tools import values
from llmgw.tools.values import ParseError

_GPU = re.compile(r"^GPU (\d+): (.*?)\s*(?:\(UUID: ([^)]+)\))?\s*$")
_STATUS = re.compile(r"^\s+Link (\d+): (.+?)\s*$")
_COUNTER = re.compile(r"^\s+Link (\d+): ([^:]+?)\s*:\s*(.+?)\s*$")


@dataclass(frozen=True)
class NvLink:
    """One link of one card: `gpu` index, `link` number, `speed_gbytes` per direction in GB/s as printed (None for
    "<inactive>" or a placeholder), `counters` {printed name: count} from `nvlink -e` ("Replay Errors": 0; None
    for a placeholder)."""

    gpu: int
    link: int
    speed_gbytes: float | None = None
    counters: dict[str, int | None] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        """True when `nvlink -s` gave the link a speed."""
        return self.speed_gbytes is not None

    @property
    def errors(self) -> int:
        """The sum of the known error counters (0 when none are known)."""
        return sum(v for v in self.counters.values() if v is not None)


@dataclass(frozen=True)
class NvLinkCard:
    """One card's links in link order; `name` and `uuid` as the heading printed them."""

    gpu: int
    name: str
    uuid: str
    links: tuple[NvLink, ...] = ()


def _cards(text: str, tool: str, line_re: re.Pattern[str]) -> list[tuple[int, str, str, list[tuple[int, re.Match]]]]:
    cards: list[tuple[int, str, str, list[tuple[int, re.Match]]]] = []
    for number, line in enumerate(values.command_body(text).splitlines(), 1):
        if not line.strip():
            continue
        match = _GPU.match(line)
        if match:
            cards.append((int(match.group(1)), match.group(2), match.group(3) or "", []))
            continue
        match = line_re.match(line)
        if match and cards:
            cards[-1][3].append((number, match))
            continue
        raise ParseError(tool, "expected 'GPU N: name (UUID: ...)' or an indented 'Link N: ...' line", number, line)
    return cards


def parse_nvlink_status(text: str) -> tuple[NvLinkCard, ...]:
    """Parse `nvidia-smi nvlink -s`: cards with their links' speeds. Empty output (no NVLink) gives ().

    Raises: ParseError naming the line for a line that is neither a GPU heading nor a link line under one.
    """
    out = []
    for gpu, name, uuid, lines in _cards(text, "nvidia-smi nvlink -s", _STATUS):
        links = []
        for _, match in lines:
            word = match.group(2)
            speed = None if "inactive" in word.lower() else values.number(word.replace("GB/s", "").strip())
            links.append(NvLink(gpu, int(match.group(1)), speed))
        out.append(NvLinkCard(gpu, name, uuid, tuple(links)))
    return tuple(out)


def parse_nvlink_errors(text: str) -> tuple[NvLinkCard, ...]:
    """Parse `nvidia-smi nvlink -e`: cards with each link's error counters (speeds unknown, None).

    Raises: ParseError naming the line for a line that is neither a GPU heading nor a "Link N: Name: value" line.
    """
    out = []
    for gpu, name, uuid, lines in _cards(text, "nvidia-smi nvlink -e", _COUNTER):
        counters: dict[int, dict[str, int | None]] = {}
        for _, match in lines:
            counters.setdefault(int(match.group(1)), {})[match.group(2)] = values.integer(match.group(3))
        out.append(NvLinkCard(gpu, name, uuid, tuple(NvLink(gpu, link, None, c) for link, c in counters.items())))
    return tuple(out)

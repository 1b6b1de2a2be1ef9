"""perftest's bandwidth tests (`ib_write_bw`, `ib_read_bw`, `ib_send_bw`): the result table, read by its headings.

Format (linux-rdma/perftest src/perftest_parameters.h: RESULT_LINE, RESULT_FMT, RESULT_FMT_G, RESULT_FMT_PER_PORT,
REPORT_FMT; the parameters block printed by `ctx_print_test_info`): a block between dashed lines naming the test
("RDMA_Write BW Test") and its settings as "Name : value" pairs, two per line ("Dual-port : OFF\t\tDevice : mlx5_0",
"Link type : IB"), the local and remote QP addresses, then the table

     #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
     65536      5000             97.63              97.61              0.186175

closed by another dashed line. The unit is in the headings: "[Gb/sec]" with `--report_gbits`, else "[MiB/sec]"
(perftest >= 4.5-0.20) or "[MB/sec]" (older, also 2^20 bytes). `--report-both`/dual-port runs add per-port columns;
`-a` prints one row per message size. Every column is read by its heading, never by position.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from llmgw.tools import values
from llmgw.tools.values import ParseError

_DASHES = re.compile(r"^-{20,}\s*$")
_SETTING = re.compile(r"([A-Za-z][A-Za-z0-9 .*/_-]*?)\s*:\s*(\S+(?:\[[^\]]*\])?)")
_TEST_NAME = re.compile(r"^\s*([A-Za-z_]+ (?:BW|Lat) Test)\s*$")
_HEADING_SPLIT = re.compile(r"\s{2,}|\t+")
_UNIT = re.compile(r"^(?P<name>.*?)\[(?P<unit>[^\]]+)\]$")
# Bytes per second of one unit, to reach Gb/s (10^9 bits per second).
_TO_GBPS = {"gb/sec": 1.0, "mib/sec": 1024**2 * 8 / 1e9, "mb/sec": 1024**2 * 8 / 1e9}


@dataclass(frozen=True)
class BwRow:
    """One row of the table: `size_bytes`, `iterations`, `peak_gbps` and `average_gbps` in Gb/s (converted from
    the printed unit), `msg_rate_mpps`, and `columns` {heading: number} with every printed column as printed."""

    size_bytes: int
    iterations: int | None
    peak_gbps: float | None
    average_gbps: float | None
    msg_rate_mpps: float | None
    columns: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class BwResult:
    """One perftest bandwidth run: `test` ("RDMA_Write BW Test"), `settings` {name: value} from its parameters block
    ("Device": "mlx5_0", "Link type": "IB", "Number of qps": "1"), `unit` as printed ("Gb/sec"), `rows`."""

    test: str
    settings: dict[str, str]
    unit: str
    rows: tuple[BwRow, ...]

    @property
    def device(self) -> str:
        return self.settings.get("Device", "")

    @property
    def best_average_gbps(self) -> float | None:
        """The highest average bandwidth over the rows (Gb/s); None without rows."""
        known = [r.average_gbps for r in self.rows if r.average_gbps is not None]
        return max(known) if known else None


def _heading_key(heading: str) -> tuple[str, str]:
    """("BW average", "Gb/sec") from "BW average[Gb/sec]"; ("#bytes", "") from "#bytes"."""
    match = _UNIT.match(heading.strip())
    return (match.group("name").strip(), match.group("unit")) if match else (heading.strip(), "")


def parse_perftest_bw(text: str) -> BwResult:
    """Parse the output of a perftest bandwidth test (client or server side).

    Raises: ParseError when there is no "#bytes" table (the run failed: its first line is in the error), when the
    bandwidth unit is not Gb/sec, MiB/sec or MB/sec, or when a row has fewer numbers than headings.
    """
    lines = values.command_body(text).splitlines()
    test = ""
    settings: dict[str, str] = {}
    header_at = None
    for number, line in enumerate(lines):
        if line.strip().startswith("#bytes"):
            header_at = number
            break
        match = _TEST_NAME.match(line)
        if match:
            test = match.group(1)
            continue
        if " : " in line or "\t: " in line:
            for name, value in _SETTING.findall(line):
                settings.setdefault(name.strip(), value.strip())
    if header_at is None:
        first = next((line for line in lines if line.strip() and not _DASHES.match(line)), "")
        raise ParseError("perftest", "no '#bytes ...' result table", 1 if first else 0, first)
    headings = [h for h in _HEADING_SPLIT.split(lines[header_at].strip()) if h]
    keys = [_heading_key(h) for h in headings]
    units = {unit for name, unit in keys if name.startswith("BW")}
    if len(units) != 1 or next(iter(units)).lower() not in _TO_GBPS:
        raise ParseError("perftest", f"bandwidth unit {sorted(units)} is not Gb/sec, MiB/sec or MB/sec",
                         header_at + 1, lines[header_at])
    unit = next(iter(units))
    factor = _TO_GBPS[unit.lower()]
    rows = []
    for number in range(header_at + 1, len(lines)):
        line = lines[number]
        if _DASHES.match(line) or not line.strip():
            break
        cells = line.split()
        if len(cells) < len(headings):
            raise ParseError("perftest", f"a row with {len(cells)} numbers under {len(headings)} headings",
                             number + 1, line)
        columns = {h: values.number(c) for h, c in zip(headings, cells)}
        by_name = {name: values.number(c) for (name, _), c in zip(keys, cells)}
        size = values.integer(cells[0])
        if size is None:
            raise ParseError("perftest", f"message size {cells[0]!r} is not a number", number + 1, line)

        def gbps(name: str) -> float | None:
            value = by_name.get(name)
            return None if value is None else value * factor

        iterations = by_name.get("#iterations")
        rows.append(BwRow(size, int(iterations) if iterations is not None else None, gbps("BW peak"),
                          gbps("BW average"), by_name.get("MsgRate"), columns))
    return BwResult(test, settings, unit, tuple(rows))

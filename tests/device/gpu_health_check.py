"""Device check for a real NVIDIA machine: GPU health read through llmgw's NVML code against nvidia-smi, field by field.

Run it on a GPU node from the repository root, in one go (about 2 s on one H200; nothing is changed on the machine):

    .venv/bin/python tests/device/gpu_health_check.py [--json OUT.json]

It reads every whole card twice, through `llmgw.agent.nvml_health.read_nvml_health` (the real `pynvml` of
nvidia-ml-py) and through `nvidia-smi -q -x` parsed by `llmgw.tools.parse_smi_health`, plus `nvidia-smi nvlink -e`
against NVML's per-link counters, and prints one table per card: field, NVML, nvidia-smi, and "ok" / "DIFF" /
"(volatile)". Then each side's verdict (`llmgw.tools.card_verdict`) and the time one reading took each way.

Fields that may differ between two reads taken a moment apart are marked volatile and not counted: the current PCIe
generation and width (they drop at idle) and the clock event reasons. `gen_host_max` has no NVML call (None there).
Exit status: 0 when every other field matches, 1 when one differs, 2 when there is no NVML or no nvidia-smi.
With `$OUT` set (the device runner's output folder) or `--json`, the whole comparison is also written as JSON, so
a later session can keep it under tests/fixtures/ as a capture.

It lies in tests/device/, which pytest does not collect (`collect_ignore` in tests/conftest.py), so `make test` never
runs it; its comparison (`compare`) is unit-tested on the H200 captures by tests/agent/test_gpu_health_check_script.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from llmgw.agent.nvml_health import read_nvml_health  # noqa: E402
from llmgw.tools import CardHealth, card_verdict, parse_nvlink_errors, parse_smi_health  # noqa: E402

VOLATILE = {"pcie.gen_current", "pcie.width_current", "clock_events"}
NVML_LACKS = {"pcie.gen_host_max"}


def flatten(card: CardHealth) -> dict[str, object]:
    """{"pcie.gen_max": 5, "ecc.volatile_corrected": 0, "remapped_rows.pending": False, ...} of one card."""
    out: dict[str, object] = {}
    for f in fields(card):
        value = getattr(card, f.name)
        if hasattr(value, "__dataclass_fields__"):
            for key, inner in asdict(value).items():
                out[f"{f.name}.{key}"] = inner
        else:
            out[f.name] = value
    return out


def compare(nvml_cards, smi_cards) -> list[dict]:
    """One row per (card, field): {"card", "field", "nvml", "nvidia_smi", "status": "ok" | "DIFF" | "(volatile)" |
    "(no NVML call)"}. Cards are matched by UUID; a card only one side lists is one DIFF row."""
    rows = []
    by_uuid = {c.uuid: c for c in smi_cards}
    for card in nvml_cards:
        other = by_uuid.pop(card.uuid, None)
        if other is None:
            rows.append({"card": card.index, "field": "listed", "nvml": card.uuid, "nvidia_smi": None, "status": "DIFF"})
            continue
        mine, theirs = flatten(card), flatten(other)
        for key in sorted(set(mine) | set(theirs)):
            a, b = mine.get(key), theirs.get(key)
            status = ("(volatile)" if key in VOLATILE else "(no NVML call)" if key in NVML_LACKS
                      else "ok" if a == b else "DIFF")
            rows.append({"card": card.index, "field": key, "nvml": a, "nvidia_smi": b, "status": status})
    for uuid, card in by_uuid.items():
        rows.append({"card": card.index, "field": "listed", "nvml": None, "nvidia_smi": uuid, "status": "DIFF"})
    return rows


def compare_nvlinks(nvml_links, smi_links) -> list[dict]:
    """One row per (card, link, counter) both sides name: NVML's counter against `nvidia-smi nvlink -e`'s."""
    rows = []
    smi = {(c.gpu, link.link): link.counters for c in smi_links for link in c.links}
    for card in nvml_links:
        for link in card.links:
            theirs = smi.get((card.gpu, link.link), {})
            for name, value in link.counters.items():
                if name in theirs:
                    rows.append({"card": card.gpu, "field": f"nvlink {link.link} {name}", "nvml": value,
                                 "nvidia_smi": theirs[name], "status": "ok" if value == theirs[name] else "DIFF"})
    return rows


def _table(rows: list[dict]) -> str:
    width = max((len(r["field"]) for r in rows), default=10)
    lines = [f"{'field':<{width}}  {'NVML':<40}  {'nvidia-smi':<40}  status"]
    for r in rows:
        lines.append(f"{r['field']:<{width}}  {str(r['nvml'])[:40]:<40}  {str(r['nvidia_smi'])[:40]:<40}  {r['status']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the comparison here (default: $OUT/gpu_health_check.json)")
    args = parser.parse_args(argv)
    try:
        import pynvml
    except ImportError:
        print("nvidia-ml-py (pynvml) is not installed: `make venv` installs it", file=sys.stderr)
        return 2
    started = time.perf_counter()
    nvml = read_nvml_health(pynvml)
    nvml_s = time.perf_counter() - started
    if nvml is None:
        print("NVML did not start (no NVIDIA driver here?)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        xml = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True, timeout=60, check=True).stdout
        links = subprocess.run(["nvidia-smi", "nvlink", "-e"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"nvidia-smi failed: {exc}", file=sys.stderr)
        return 2
    smi_s = time.perf_counter() - started
    smi_cards = parse_smi_health(xml)
    rows = compare(nvml.cards, smi_cards) + compare_nvlinks(nvml.nvlinks, parse_nvlink_errors(links))
    for index in sorted({r["card"] for r in rows}):
        print(f"\nGPU {index}")
        print(_table([r for r in rows if r["card"] == index]))
    verdicts = {
        "nvml": [[f.code for f in card_verdict(c).findings] for c in nvml.cards],
        "nvidia_smi": [[f.code for f in card_verdict(c).findings] for c in smi_cards],
    }
    diffs = [r for r in rows if r["status"] == "DIFF"]
    print(f"\nverdicts (finding codes per card): NVML {verdicts['nvml']}, nvidia-smi {verdicts['nvidia_smi']}")
    print(f"NVML notes: {list(nvml.notes) or 'none'}")
    print(f"one reading: NVML {nvml_s * 1000:.1f} ms, nvidia-smi -q -x + nvlink -e {smi_s * 1000:.1f} ms "
          f"(ratio {smi_s / nvml_s if nvml_s else float('inf'):.1f}x)")
    print(f"{len(diffs)} field(s) differ" if diffs else "every compared field matches")
    target = args.json or (str(Path(os.environ["OUT"]) / "gpu_health_check.json") if os.environ.get("OUT") else None)
    if target:
        Path(target).write_text(json.dumps({"rows": rows, "verdicts": verdicts, "notes": list(nvml.notes),
                                            "nvml_seconds": nvml_s, "nvidia_smi_seconds": smi_s,
                                            "nvidia_smi_q_x": xml, "nvidia_smi_nvlink_e": links},
                                           indent=1, default=str))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())

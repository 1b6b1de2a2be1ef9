"""Every parser of llmgw.tools, fed seeded random garbage and mutilated real captures, returns data or raises its
ParseError: never another exception. Judgements on whatever parses never raise either."""

from __future__ import annotations

import random

import pytest

from fixture_files import fixture
from llmgw.tools import (
    ParseError, card_verdict, parse_ibnetdiscover, parse_ibstat, parse_nvlink_errors, parse_nvlink_status,
    parse_pcie_bandwidth, parse_perftest_bw, parse_saquery_smir, parse_smi_health, parse_smi_list, parse_smi_xml, parse_sminfo,
    parse_topo_matrix, parse_xids,
)

# Each parser with a real (or hand-made) capture of its own format to mutilate.
PARSERS = [
    (parse_smi_health, "nvidia-h200/nvidia-smi-q-x.xml"),
    (lambda text: parse_smi_xml(text).report, "telegraf/a100-sxm4-v12.xml"),
    (parse_smi_list, "nvidia-h200/nvidia-smi-L.txt"),
    (parse_topo_matrix, "nvidia-h200/nvidia-smi-topo-m.txt"),
    (parse_nvlink_status, "gpud/nvlink-s-8xa100.txt"),
    (parse_nvlink_errors, "ml-engineering/nvlink-e-h100-excerpt.txt"),
    (parse_xids, "hand-made/kernel-log-journalctl.txt"),
    (parse_pcie_bandwidth, "ml-engineering/dmesg-pcie-limited-by.txt"),
    (parse_ibstat, "hand-made/ibstat-roce.txt"),
    (parse_sminfo, "hand-made/sminfo-master.txt"),
    (parse_saquery_smir, "hand-made/saquery-smir-two-sms.txt"),
    (parse_ibnetdiscover, "infiniband-diags/ibnetdiscover-manpage-example.txt"),
    (parse_perftest_bw, "hand-made/perftest-write-bw-mib-degraded.txt"),
]
ALPHABET = "\t\n ():;,.[]<>/=\"'#-_0123456789abcdefxABCDEFX|&" + "GPU Link Port CA Switch NVRM Xid lid "


def mutilations(text: str, rng: random.Random, count: int):
    """Random text, and `text` with lines dropped, repeated, shuffled, truncated or characters replaced."""
    lines = text.splitlines(keepends=True)
    for _ in range(count):
        kind = rng.randrange(7)
        if kind == 0:
            yield "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(400)))
        elif kind == 1:
            yield bytes(rng.randrange(256) for _ in range(rng.randrange(300))).decode("utf-8", "replace")
        elif kind == 2:
            yield text[:rng.randrange(len(text) + 1)]
        elif kind == 3:
            yield "".join(line for line in lines if rng.random() > 0.2)
        elif kind == 4:
            shuffled = lines[:]
            rng.shuffle(shuffled)
            yield "".join(shuffled)
        elif kind == 5:
            chars = list(text)
            for _ in range(rng.randrange(1, 20)):
                if chars:
                    chars[rng.randrange(len(chars))] = rng.choice(ALPHABET)
            yield "".join(chars)
        else:
            picked = [rng.choice(lines) for _ in range(rng.randrange(1, 30))] if lines else []
            yield "".join(picked)


@pytest.mark.parametrize("parser, capture", PARSERS, ids=[c for _, c in PARSERS])
def test_a_parser_returns_data_or_raises_parse_error_on_garbage(parser, capture):
    rng = random.Random(f"llmgw-tools-{capture}")
    text = fixture(capture)
    parsed = rejected = 0
    for garbage in mutilations(text, rng, 400):
        try:
            result = parser(garbage)
        except ParseError as exc:
            assert str(exc)  # a sentence naming the tool
            rejected += 1
            continue
        parsed += 1
        if parser is parse_smi_health:
            for card in result:
                card_verdict(card)
    assert parsed + rejected == 400 and parsed > 0

"""The audit's status.yaml is dumped in proportion to the change, and byte for byte as a whole dump would be."""

from __future__ import annotations

import random

import pytest

from llmgw.control.audit_yaml import StatusYaml, dump_yaml

ERRORS = (
    "",
    "engine exited with status 1",
    "llama-server: error: failed to load model 'x.gguf': file is truncated, expected 253 MB, found 12 MB; "
    "fetch the weights again",
    "line one\nline two: with a colon\n  and an indented third",
    "quote ' and \" and # hash, a: colon, - dash, {brace} [bracket] * star & amp ! bang % percent @ at `tick`",
    "unicode: ✓ — ü",
    "yes",
    "0123",
    "null",
)


def random_node(rng: random.Random, n: int) -> dict:
    shards = {}
    for k in range(rng.randrange(0, 4)):
        entry = {"replica": f"base-{rng.randrange(1000)}", "model": "base", "state": rng.choice(("starting", "ready")),
                 "settings_commit": f"{rng.getrandbits(160):040x}", "port": 40000 + k,
                 "devices": [str(d) for d in range(rng.randrange(1, 5))]}
        if rng.random() < 0.3:
            entry["error"] = rng.choice(ERRORS)
        shards[f"s{n}-{k}"] = entry
    node = {"state": rng.choice(("connected", "disconnected", "lost")), "address": f"10.0.{n // 250}.{n % 250}",
            "gpus": 8, "cpu_cores": 192, "engines": ["llama.cpp@b11434"], "shards": shards}
    if rng.random() < 0.2:
        node["warnings"] = [rng.choice(ERRORS) for _ in range(2)]
    if rng.random() < 0.1:
        node["health"] = {"gpus": {"0": {"ok": False, "reasons": [rng.choice(ERRORS)]}}, "checked_at": 1796116045.25}
    return node


def random_replica(rng: random.Random, n: int) -> dict:
    entry = {"model": "base", "shards": {}, "node": f"sim{rng.randrange(50):05d}",
             "state": rng.choice(("pending", "starting", "ready", "unplaced"))}
    if entry["state"] == "unplaced":
        entry["unplaced"] = {f"sim{k:05d}": rng.choice(ERRORS) or "no room" for k in range(rng.randrange(1, 3))}
    return entry


def random_status(rng: random.Random, nodes: int = 8) -> dict:
    return {
        "settings": {"commit": f"{rng.getrandbits(160):040x}", "head": None, "serving_stopped": False},
        "nodes": {f"sim{n:05d}": random_node(rng, n) for n in range(nodes)},
        "replicas": {f"base-{n}": random_replica(rng, n) for n in range(2 * nodes)},
        "failures": [{"action": "start", "error": rng.choice(ERRORS)}] if rng.random() < 0.5 else [],
        "pass": {"number": rng.randrange(1000), "converged": rng.random() < 0.5, "duration": rng.random()},
    }


def changed(rng: random.Random, doc: dict) -> dict:
    """A new document (as the control plane builds one per pass) with a few entries changed, added or removed."""
    new = {**doc, "nodes": dict(doc["nodes"]), "replicas": dict(doc["replicas"]), "pass": {**doc["pass"], "number": 1}}
    for _ in range(rng.randrange(0, 4)):
        name = rng.choice(list(new["nodes"]))
        new["nodes"][name] = random_node(rng, int(name[3:]))
    if rng.random() < 0.3 and len(new["nodes"]) > 1:
        del new["nodes"][rng.choice(list(new["nodes"]))]
    if rng.random() < 0.3:
        new["nodes"][f"sim{rng.randrange(1000, 1100):05d}"] = random_node(rng, 77)
    for _ in range(rng.randrange(0, 4) if new["replicas"] else 0):
        name = rng.choice(list(new["replicas"]))
        new["replicas"][name] = random_replica(rng, 0)
    if rng.random() < 0.1:
        new["replicas"] = {}
    return new


@pytest.mark.parametrize("seed", range(24))
def test_each_dump_is_byte_for_byte_the_whole_dump(seed: int) -> None:
    rng = random.Random(seed)
    dumper = StatusYaml()
    doc = random_status(rng)
    for _ in range(6):
        assert dumper.dump(doc) == dump_yaml(doc)
        doc = changed(rng, doc)


def test_a_commit_after_one_node_changed_dumps_that_node_only() -> None:
    rng = random.Random(7)
    dumper = StatusYaml()
    doc = random_status(rng, nodes=200)
    dumper.dump(doc)
    assert dumper.dumped == 600 and dumper.reused == 0
    later = {**doc, "nodes": {**doc["nodes"], "sim00042": {**doc["nodes"]["sim00042"], "state": "lost"}}}
    assert dumper.dump(later) == dump_yaml(later)
    assert (dumper.dumped, dumper.reused) == (601, 599)

"""A large admin API document (a fleet's status) is encoded in a worker thread, entry by entry, to exactly the
bytes one `json.dumps` gives: the console, `llmgw status` and scripts see no change."""

from __future__ import annotations

import random

import pytest

from llmgw.control.admin import _encode, _encode_in_parts, _large


def random_value(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth > 2 or roll < 0.3:
        return rng.choice([None, True, 0, -7, 2.5, 1e300, "", "é\n\"x\"", "ready"])
    if roll < 0.5:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if roll < 0.6:
        return tuple(random_value(rng, depth + 1) for _ in range(rng.randrange(3)))
    return {rng.choice(["state", "n1", "é", "a\"b", "1"]) + str(n): random_value(rng, depth + 1)
            for n in range(rng.randrange(4))}


@pytest.mark.parametrize("seed", range(20))
def test_a_large_document_encodes_to_the_bytes_of_one_dump(seed):
    rng = random.Random(seed)
    doc = {"settings": random_value(rng), "pass": None,
           "nodes": {f"node-{n:05d}": random_value(rng) for n in range(rng.randrange(65, 300))},
           "replicas": {f"m-{n}": random_value(rng) for n in range(rng.randrange(0, 200))},
           "failures": [random_value(rng) for _ in range(3)]}
    assert _large(doc)
    assert _encode_in_parts(doc) == _encode(doc)


def test_small_documents_and_other_keys_are_dumped_at_once():
    assert not _large({"nodes": {"n1": {}}})
    assert _encode_in_parts({1: {str(n): n for n in range(100)}}) == _encode({1: {str(n): n for n in range(100)}})

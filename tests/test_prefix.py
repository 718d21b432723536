from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest
import torch

from radixmesh.prefix import ROOT_HASH, block_hashes, common_prefix_len, num_full_blocks

MASK = (1 << 64) - 1


def _splitmix64_keys(n: int) -> list[int]:
    state, keys = 0x72616469786D657368, []
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        keys.append(z ^ (z >> 31))
    return keys


def _reference(tokens: list[int], block_size: int, parent: int | None = None) -> list[int]:
    """The documented scheme, written out block by block in Python ints."""
    keys = _splitmix64_keys(block_size)
    h = ROOT_HASH if parent is None else parent
    out = []
    for b in range(len(tokens) // block_size):
        digest = 0
        for i, t in enumerate(tokens[b * block_size : (b + 1) * block_size]):
            y = ((t ^ keys[i]) * 0x9E3779B97F4A7C15) & MASK
            digest = (digest + (y ^ (y >> 32))) & MASK
        h = (0xD6E8FEB86659FD93 * h + digest) & MASK
        out.append(h)
    return out


def test_root_hash_is_pinned() -> None:
    # Changing the scheme silently would make routers and workers disagree: pin it.
    expected = hashlib.blake2b(b"radixmesh.prefix.v2", digest_size=8).digest()
    assert int.from_bytes(expected, "little") == ROOT_HASH
    assert block_hashes([1, 2, 3, 4], 4) == [14216955594074928602]


def test_matches_reference_and_ignores_partial_block() -> None:
    tokens = list(range(100, 139))  # 39 tokens: 2 full blocks of 16, 7 left over
    hashes = block_hashes(tokens, 16)
    assert len(hashes) == 2
    assert hashes == _reference(tokens[:32], 16)
    assert all(0 <= h < 2**64 for h in hashes)


@pytest.mark.parametrize("block_size", [1, 3, 16, 64])
def test_matches_reference_on_random_input(block_size: int) -> None:
    rng = np.random.default_rng(block_size)
    tokens = rng.integers(0, 2**32, size=40 * block_size + 1).tolist()
    parent = int(rng.integers(0, 2**63)) * 2 + 1
    assert block_hashes(tokens, block_size) == _reference(tokens, block_size)
    assert block_hashes(tokens, block_size, parent) == _reference(tokens, block_size, parent)
    # The power tables grow past their cached length on a long input.
    long = rng.integers(0, 50_000, size=5000).tolist()
    assert block_hashes(long, 1) == _reference(long, 1)


def test_chaining_with_parent_hash() -> None:
    tokens = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    full = block_hashes(tokens, 4)
    assert block_hashes(tokens[4:], 4, parent_hash=full[0]) == full[1:]
    assert block_hashes(tokens[8:], 4, parent_hash=full[1]) == full[2:]


def test_blocks_are_aligned_to_block_size() -> None:
    tokens = np.random.default_rng(5).integers(0, 49152, size=10 * 8 + 5).tolist()
    full = block_hashes(tokens, 8)
    assert len(full) == 10
    # Continuing from any block boundary gives the same hashes (the radix cache does this).
    for k in range(1, 10):
        assert block_hashes(tokens[k * 8 :], 8, parent_hash=full[k - 1]) == full[k:]
    # Shifted by one token, the blocks are different blocks: no hash in common.
    assert not set(block_hashes(tokens[1:], 8)) & set(full)


def test_prefix_identity_and_sensitivity() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = block_hashes([1, 2, 3, 4, 5, 6, 7, 9], 4)
    c = block_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert a[0] == b[0] and a[1] != b[1]
    # Chained: a change in block 0 changes every later hash, even with equal block 1.
    assert c[0] != a[0] and c[1] != a[1]
    assert block_hashes([1, 2, 3, 4], 4) != block_hashes([1, 2, 3, 4], 2)[:1]


def test_every_token_counts_in_its_block_and_all_later_ones() -> None:
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 49152, size=64).tolist()
    base = block_hashes(tokens, 16)
    for pos in range(64):
        changed = list(tokens)
        changed[pos] = (changed[pos] + 1 + pos) % 49152
        hashes = block_hashes(changed, 16)
        block = pos // 16
        assert hashes[:block] == base[:block]
        assert all(h != b for h, b in zip(hashes[block:], base[block:], strict=True)), pos
    # Position within a block matters: a swap is a different block.
    assert block_hashes([1, 2], 2) != block_hashes([2, 1], 2)


def test_no_collisions_in_large_samples() -> None:
    # Every 7-token block over a 4-token vocabulary (16,384 blocks differing in few bits).
    grid = np.stack(np.meshgrid(*[np.arange(4)] * 7, indexing="ij"), -1).reshape(-1, 7)
    firsts = {block_hashes(row, 7)[0] for row in grid.tolist()}
    assert len(firsts) == 4**7
    # 200,000 chained prefixes of a binary sequence: repeated blocks, distinct prefixes.
    tokens = np.random.default_rng(3).integers(0, 2, size=200_000 * 4).tolist()
    assert len(set(block_hashes(tokens, 4))) == 200_000


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


def test_common_prefix_len() -> None:
    assert common_prefix_len([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([7], [8]) == 0

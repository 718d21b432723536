"""How a token sequence is cut into blocks and hashed: one definition for worker and router.

Workers publish which prefix blocks their radix cache holds (`CacheEvent`s carrying these
hashes); the router hashes an incoming prompt with the same function and looks for the
longest run of leading blocks a worker holds. Both sides must agree bit for bit, so this
module is the only place the scheme is defined.

The scheme (version 1):

- A sequence is cut into blocks of `block_size` tokens; only FULL blocks are hashed, a
  trailing partial block is ignored (a cache can only report whole blocks).
- Block i's hash chains on the one before it::

      h_i = blake2b(digest_size=8)(le64(h_{i-1}) || le32(t_0) || ... || le32(t_{B-1}))

  read back as a little-endian unsigned 64-bit int, with `h_{-1} = ROOT_HASH` (a fixed
  seed, itself a blake2b digest of a version tag). Because of the chaining, one hash
  names a whole prefix: equal hashes mean equal prefixes (up to 64-bit collisions), so
  a summary can be a flat set of hashes.
- Token ids must fit in uint32. Nothing depends on Python's `hash()`, so the values are
  stable across processes, machines and Python versions.

`parent_hash` lets a caller continue a chain from the middle of a sequence (the radix
cache hashes each tree node's tokens starting from its parent's last block hash).
"""

from __future__ import annotations

import array
import hashlib
import sys
from collections.abc import Sequence

import numpy as np

_MAX_HASH = (1 << 64) - 1
# The chain's seed: fixed forever for scheme version 1 (changing it changes every hash).
ROOT_HASH: int = int.from_bytes(
    hashlib.blake2b(b"radixmesh.prefix.v1", digest_size=8).digest(), "little"
)


def num_full_blocks(num_tokens: int, block_size: int) -> int:
    """How many full blocks of `block_size` tokens `num_tokens` tokens contain."""
    if block_size < 1:
        raise ValueError(f"block_size: must be >= 1, got {block_size}")
    if num_tokens < 0:
        raise ValueError(f"num_tokens: must be >= 0, got {num_tokens}")
    return num_tokens // block_size


def block_hashes(
    token_ids: Sequence[int], block_size: int, parent_hash: int | None = None
) -> list[int]:
    """Chained 64-bit hashes of the full blocks of `token_ids` (see the module docstring).

    `parent_hash` is the hash of the block just before `token_ids[0]` (None: the sequence
    starts at the root). Returns one int in [0, 2**64) per full block.
    """
    n_blocks = num_full_blocks(len(token_ids), block_size)
    if n_blocks == 0:
        return []
    data = _pack_tokens(token_ids, n_blocks * block_size)
    prev = (ROOT_HASH if parent_hash is None else _check_hash(parent_hash)).to_bytes(8, "little")
    stride = 4 * block_size
    # The router hashes every prompt on its routing path: one blake2b call per block on
    # concatenated bytes, names bound locally (~0.5 us a block).
    blake2b, from_bytes = hashlib.blake2b, int.from_bytes
    out: list[int] = []
    for start in range(0, len(data), stride):
        prev = blake2b(prev + data[start : start + stride], digest_size=8).digest()
        out.append(from_bytes(prev, "little"))
    return out


_U32 = next(code for code in "IL" if array.array(code).itemsize == 4)


def _pack_tokens(token_ids: Sequence[int], n: int) -> bytes:
    """The first `n` token ids as little-endian uint32 bytes, range-checked."""
    if isinstance(token_ids, list | tuple):
        # array.array packs a list ~3x faster than numpy and range-checks it itself.
        try:
            packed = array.array(_U32, token_ids[:n])
        except (OverflowError, TypeError):
            pass  # out of range (or not plain ints): numpy below names the problem
        else:
            if sys.byteorder == "big":
                packed.byteswap()
            return packed.tobytes()
    arr = np.asarray(token_ids[:n], dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"token_ids: must be a flat sequence, got shape {arr.shape}")
    # One min/max pass is cheaper than letting a wrap-around silently alias two prompts.
    if int(arr.min()) < 0 or int(arr.max()) > 0xFFFFFFFF:
        raise ValueError("token_ids: every token id must be in [0, 2**32)")
    return arr.astype("<u4").tobytes()


def _check_hash(value: int) -> int:
    if not 0 <= value <= _MAX_HASH:
        raise ValueError(f"parent_hash: must be an unsigned 64-bit int, got {value}")
    return value

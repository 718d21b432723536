"""How a token sequence is cut into blocks and hashed: one definition for worker and router.

Workers publish which prefix blocks their radix cache holds (`CacheEvent`s carrying these
hashes); the router hashes an incoming prompt with the same function and looks for the
longest run of leading blocks a worker holds. Both sides must agree bit for bit, so this
module is the only place the scheme is defined.

The scheme (version 2; all arithmetic modulo 2**64):

- A sequence is cut into blocks of `block_size` tokens; only FULL blocks are hashed, a
  trailing partial block is ignored (a cache can only report whole blocks).
- Block k's digest mixes each token with its position i in the block, then sums::

      f_i(t) = y ^ (y >> 32)  where  y = (t ^ S_i) * M
      d_k    = f_0(t_0) + f_1(t_1) + ... + f_{B-1}(t_{B-1})

  with `S_i` the i-th output of splitmix64 seeded with `_SEED` and `M` an odd constant.
  Each f_i is a bijection of 64-bit words (xor, odd multiply, xorshift by >= 32 are), so
  blocks that differ in one token always differ; otherwise two blocks' digests coincide
  with probability ~2**-64 for unrelated contents.
- Blocks chain: ``h_k = A * h_{k-1} + d_k`` with `A` odd and `h_{-1} = ROOT_HASH` (or the
  caller's `parent_hash`). So h_k is a function of every token up to the end of block k:
  one hash names a whole prefix, and a summary can be a flat set of hashes. Being linear,
  the chain is computed for all blocks at once (a prefix sum of ``A**-j * d_j``, scaled
  by ``A**k``), and the per-token mixing is a few vectorized numpy operations: ~25 us for
  a 2,048-token prompt where one blake2b call per block took ~80 us, on the router's
  per-request path.
- Token ids must fit in uint32. Nothing depends on Python's `hash()`, so the values are
  stable across processes, machines and Python versions.

Collisions. This is not a cryptographic hash: two unrelated prefixes collide with
probability ~2**-64 per pair, but inputs can be built to collide (e.g. two block contents
X and Y laid out in Thue-Morse order over 2,048 blocks collide for any odd `A`). That is
acceptable because a hash only ever estimates where a prefix is cached: the router uses
the hashes to count a worker's leading cached blocks (`router/summary.py`) and sends the
worker token ids; the worker's radix cache matches and reuses KV by the tokens themselves
(its tree is keyed by token ids) and computes hashes only to publish events. A collision
can therefore make the router overestimate one worker's cache (a worse routing choice,
a slower request), never make a worker reuse the wrong KV or change any output.

Changing any constant (or the scheme) changes every hash: workers and routers of different
versions would see no common blocks (routing by load only) until all are upgraded.

`parent_hash` lets a caller continue a chain from the middle of a sequence (the radix
cache hashes each tree node's tokens starting from its parent's last block hash).
"""

from __future__ import annotations

import array
import hashlib
from collections.abc import Sequence

import numpy as np

_MASK = (1 << 64) - 1
_MAX_HASH = _MASK
# The chain's seed: fixed forever for scheme version 2 (changing it changes every hash).
ROOT_HASH: int = int.from_bytes(
    hashlib.blake2b(b"radixmesh.prefix.v2", digest_size=8).digest(), "little"
)
_SEED = 0x7261646978_6D657368  # "radixmesh": seeds the per-position keys S_i
_M = 0x9E3779B97F4A7C15  # odd: token mixing multiplier (2**64 / golden ratio)
_A = 0xD6E8FEB86659FD93  # odd: the chain's multiplier
_A_INV = pow(_A, -1, 1 << 64)


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
    parent = ROOT_HASH if parent_hash is None else _check_hash(parent_hash)
    tokens = _as_uint32(token_ids, n_blocks * block_size).reshape(n_blocks, block_size)
    # Per-token mixing, f_i(t) for every token at once: [n_blocks, block_size] uint64.
    y = tokens ^ _position_keys(block_size)
    y *= _U64_M
    y ^= y >> _U64_32
    digests = y.sum(axis=1)  # [n_blocks] uint64; numpy's uint64 arithmetic wraps
    # h_k = A**(k+1) * parent + sum_{j<=k} A**(k-j) * d_j = A**k * (A*parent + sum A**-j d_j)
    powers, inverse_powers = _powers(n_blocks)
    chained = np.cumsum(digests * inverse_powers, dtype=np.uint64)
    chained += np.uint64((_A * parent) & _MASK)
    chained *= powers
    return chained.tolist()


_U64_M = np.uint64(_M)
_U64_32 = np.uint64(32)
_U32 = next(code for code in "IL" if array.array(code).itemsize == 4)
_KEYS: dict[int, np.ndarray] = {}
_POWERS = np.ones(1, dtype=np.uint64)  # A**j, j = 0, 1, ...
_INVERSE_POWERS = np.ones(1, dtype=np.uint64)  # A**-j


def _splitmix64(state: int) -> tuple[int, int]:
    """The next state and output of splitmix64 (a fixed, well-known generator)."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return state, z ^ (z >> 31)


def _position_keys(block_size: int) -> np.ndarray:
    """S_0 .. S_{block_size-1} (the same first keys for every block size)."""
    keys = _KEYS.get(block_size)
    if keys is None:
        state, out = _SEED, []
        for _ in range(block_size):
            state, key = _splitmix64(state)
            out.append(key)
        keys = _KEYS[block_size] = np.array(out, dtype=np.uint64)
    return keys


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """A**0 .. A**(n-1) and their inverses mod 2**64 (tables grown by doubling)."""
    global _POWERS, _INVERSE_POWERS
    while len(_POWERS) < n:
        m = len(_POWERS)
        step, inverse_step = np.uint64(pow(_A, m, 1 << 64)), np.uint64(pow(_A_INV, m, 1 << 64))
        _POWERS = np.concatenate([_POWERS, _POWERS * step])
        _INVERSE_POWERS = np.concatenate([_INVERSE_POWERS, _INVERSE_POWERS * inverse_step])
    return _POWERS[:n], _INVERSE_POWERS[:n]


def _as_uint32(token_ids: Sequence[int], n: int) -> np.ndarray:
    """The first `n` token ids as a uint32 array, range-checked."""
    if isinstance(token_ids, list | tuple):
        # array.array packs a list ~3x faster than numpy and range-checks it itself (the
        # slice is skipped when it would copy the whole list: ~3 us at 2,048 tokens).
        try:
            packed = array.array(_U32, token_ids if n == len(token_ids) else token_ids[:n])
        except (OverflowError, TypeError):
            pass  # out of range (or not plain ints): numpy below names the problem
        else:
            return np.frombuffer(packed, dtype=np.uint32)
    arr = np.asarray(token_ids[:n], dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"token_ids: must be a flat sequence, got shape {arr.shape}")
    # One min/max pass is cheaper than letting a wrap-around silently alias two prompts.
    if int(arr.min()) < 0 or int(arr.max()) > 0xFFFFFFFF:
        raise ValueError("token_ids: every token id must be in [0, 2**32)")
    return arr.astype(np.uint32)


def _check_hash(value: int) -> int:
    if not 0 <= value <= _MAX_HASH:
        raise ValueError(f"parent_hash: must be an unsigned 64-bit int, got {value}")
    return value


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n

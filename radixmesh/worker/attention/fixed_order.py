"""Attention with a fixed summation order per query, for deterministic mode on CPU.

SDPA's CPU kernel cuts queries and keys into blocks sized by the call (the query count,
the padded key length) and runs its GEMMs through kernels chosen by shape, so a query's
output changes in its last bits with the batch beside it, with a cached prefix (fewer
queries, the same keys) and with padding. Here query t at position p attends to keys
0 .. p of its sequence, and every sum is cut the same way whatever the call:

- queries are processed in blocks of `Q_BLOCK` rows (zero rows appended), keys in blocks
  of `DETERMINISTIC_BLOCK` from key 0 (zero keys appended, masked): every matrix product
  is one [Q_BLOCK, D] x [D, B] or [Q_BLOCK, B] x [B, D] product, batched (a batched GEMM
  gives each item the same bits whatever the batch count: measured);
- the row maximum is exact in any order; exp is elementwise;
- the softmax denominator and the output are summed within each key block (fixed length),
  then across blocks by a running sum (`cumsum`, sequential) read at the last block, so
  masked blocks past the query's last key add exact zeros.

It computes in float32 and materializes scores per chunk of query blocks
(`MAX_CHUNK_ELEMENTS` floats at most), so it costs more than SDPA: deterministic mode
trades speed for reproducibility (docs/determinism.md has the figures).
"""

from __future__ import annotations

import torch

from radixmesh.worker.deterministic import DETERMINISTIC_BLOCK

Q_BLOCK = 16
# Bound on one chunk's score tensor (floats): ~64 MiB.
MAX_CHUNK_ELEMENTS = 16 * 1024 * 1024
# Query blocks per chunk at most: small chunks of a causal prefill read only the key
# blocks their own queries see.
CAUSAL_CHUNK_BLOCKS = 8


def fixed_order_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q [S, E, Hq, D]: E queries of each of S sequences, at absolute `positions` [S, E]
    (long); keys/values [S, Hkv, L, D] (each sequence's keys 0 .. L-1, L > its largest
    position; keys past a sequence's own may be anything finite). Query t of sequence s
    sees keys 0 .. positions[s, t]. Returns [S, E, Hq, D] in q's dtype."""
    ns, e, hq, d = q.shape
    hkv, length = keys.shape[1], keys.shape[2]
    g = hq // hkv
    bk = DETERMINISTIC_BLOCK
    nk = -(-length // bk)
    pad_k = nk * bk - length
    k = keys.float()
    v = values.float()
    if pad_k:
        k = torch.cat([k, k.new_zeros(ns, hkv, pad_k, d)], dim=2)
        v = torch.cat([v, v.new_zeros(ns, hkv, pad_k, d)], dim=2)
    k_blocks = k.view(ns, hkv, 1, nk, bk, d).transpose(-1, -2)  # [S, Hkv, 1, nk, D, B]
    v_blocks = v.view(ns, hkv, 1, nk, bk, d)  # [S, Hkv, 1, nk, B, D]
    key_pos = torch.arange(nk * bk, device=q.device).view(nk, bk)  # [nk, B]
    # Rows: query t, head j of KV head h -> row t * G + j of KV head h.
    rows = q.float().view(ns, e, hkv, g, d).permute(0, 2, 1, 3, 4).reshape(ns, hkv, e * g, d)
    row_pos = positions.view(ns, e, 1).expand(ns, e, g).reshape(ns, e * g)  # [S, E*G]
    n_rows = e * g
    nq = -(-n_rows // Q_BLOCK)
    if nq * Q_BLOCK != n_rows:
        extra = nq * Q_BLOCK - n_rows
        rows = torch.cat([rows, rows.new_zeros(ns, hkv, extra, d)], dim=2)
        row_pos = torch.cat([row_pos, row_pos.new_zeros(ns, extra)], dim=1)
    rows = rows.view(ns, hkv, nq, 1, Q_BLOCK, d)
    row_pos = row_pos.view(ns, 1, nq, 1, Q_BLOCK, 1)
    per_block = ns * hkv * nk * Q_BLOCK * bk
    step = max(1, min(CAUSAL_CHUNK_BLOCKS, MAX_CHUNK_ELEMENTS // per_block))
    out = torch.empty(ns, hkv, nq, Q_BLOCK, d, dtype=torch.float32, device=q.device)
    last_key = positions.view(ns, e).amax(dim=0).tolist()  # [E]: the furthest key per query
    for lo in range(0, nq, step):
        hi = min(nq, lo + step)
        # Key blocks past every row's last key are masked whole: leaving them out adds no
        # term (their sums are exact zeros, the maximum ignores them), so a causal prefill
        # computes about half the products and the bits stay the same.
        rows_lo, rows_hi = lo * Q_BLOCK // g, min(e, -(-hi * Q_BLOCK // g))
        need = max(last_key[rows_lo:rows_hi]) // bk + 1
        out[:, :, lo:hi] = _blocks(
            rows[:, :, lo:hi],
            k_blocks[:, :, :, :need],
            v_blocks[:, :, :, :need],
            row_pos[:, :, lo:hi],
            key_pos[:need],
            scale,
        )
    out = out.view(ns, hkv, nq * Q_BLOCK, d)[:, :, :n_rows]  # [S, Hkv, E*G, D]
    return out.reshape(ns, hkv, e, g, d).permute(0, 2, 1, 3, 4).reshape(ns, e, hq, d).to(q.dtype)


def _blocks(
    rows: torch.Tensor,
    k_blocks: torch.Tensor,
    v_blocks: torch.Tensor,
    row_pos: torch.Tensor,
    key_pos: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """rows [S, Hkv, n, 1, Q, D] -> [S, Hkv, n, Q, D] over every key block."""
    s = torch.matmul(rows, k_blocks) * scale  # [S, Hkv, n, nk, Q, B]
    visible = key_pos.view(key_pos.shape[0], 1, -1) <= row_pos  # [S, 1, n, nk, Q, B]
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(dim=(3, 5), keepdim=True)  # [S, Hkv, n, 1, Q, 1]: key 0 is always visible
    p = torch.exp(s - m)  # [S, Hkv, n, nk, Q, B]
    denom = p.sum(dim=-1).cumsum(dim=3)[:, :, :, -1]  # [S, Hkv, n, Q]
    o = torch.matmul(p, v_blocks).cumsum(dim=3)[:, :, :, -1]  # [S, Hkv, n, Q, D]
    return o / denom.unsqueeze(-1)

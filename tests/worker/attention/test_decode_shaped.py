"""Forced tokens as decode rows (ModelRunner's decode-shaped steps): splitting a row of n
new tokens into n one-token rows at prefixes p..p+n-1 gives the causal extend's attention,
on the torch backend and on the triton decode kernel (the one the decode CUDA graph
replays; CPU through TRITON_INTERPRET=1, or CUDA)."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.attention.registry import create_attention_backend
from radixmesh.worker.forward_batch import ForwardBatch
from radixmesh.worker.model_runner import _one_row_per_token
from tests.worker.attention.test_torch_backend import HEAD_DIM, LAYER, make_case, reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def decode_shaped(batch: ForwardBatch) -> ForwardBatch:
    rows, prefixes, lens = _one_row_per_token(
        batch.req_rows.tolist(), batch.prefix_lens_cpu, batch.extend_lens_cpu
    )
    return ForwardBatch.build(
        input_ids=batch.input_ids.tolist(),
        out_cache_loc=batch.out_cache_loc,
        req_rows=rows,
        prefix_lens=prefixes,
        extend_lens=lens,
        req_to_token=batch.req_to_token,
    )


@pytest.mark.parametrize("backend_name", ["torch", "triton"])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(8, 2), (4, 4)], ids=["gqa4", "mha"])
def test_decode_rows_match_the_extend(backend_name: str, num_heads: int, num_kv_heads: int) -> None:
    # Forced runs of 9 and 3 tokens beside decoding rows of different lengths.
    seqs = [(20, 1), (31, 1), (15, 9), (4, 1), (40, 3)]
    _check_decode_rows(backend_name, seqs, num_heads, num_kv_heads)


@pytest.mark.parametrize("backend_name", ["torch", "triton"])
def test_prompt_chunks_as_decode_rows_match_the_extend(backend_name: str) -> None:
    # A prompt from scratch (12 tokens) and a chunk over a cached prefix, beside decodes.
    seqs = [(20, 1), (0, 12), (7, 5), (33, 1)]
    _check_decode_rows(backend_name, seqs, 8, 2)


def _check_decode_rows(
    backend_name: str, seqs: list[tuple[int, int]], num_heads: int, num_kv_heads: int
) -> None:
    pool, batch, q, k, v = make_case(seqs, num_heads, num_kv_heads, device=DEVICE)
    scale = HEAD_DIM**-0.5
    backend = create_attention_backend(backend_name, pool, scale)
    backend.prepare(batch)
    mixed = backend.forward(q, k, v, LAYER, batch)
    shaped = decode_shaped(batch)
    assert shaped.is_decode_only and shaped.batch_size == sum(n for _, n in seqs)
    expected = [p + i + 1 for p, n in seqs for i in range(n)]
    assert shaped.seq_lens_cpu == expected
    assert torch.equal(shaped.positions, batch.positions)  # same tokens, same places
    backend.prepare(shaped)
    out = backend.forward(q, k, v, LAYER, shaped)
    ref = reference(pool, batch, q, scale)
    tol = 1e-4 if DEVICE == "cuda" else 1e-5
    assert (out.double().cpu() - ref).abs().max() < tol
    assert (out - mixed).abs().max() < tol

"""Deterministic mode on CPU: batch-invariant GEMMs and attention, and engines whose outputs
(token ids and their logprobs' bits) do not depend on batching, cache hits or chunking.

Logprobs are compared bit for bit: dummy:tiny's greedy tokens rarely flip, but a sum whose
order depends on the batch shows in the last bits of a logprob at once (with the mode off
these checks find 2-3 distinct outputs per prompt: bench/deterministic.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from bench.deterministic import run_cached, run_mixed, run_prefix, run_single
from radixmesh.errors import InvalidArgument
from radixmesh.worker.attention.fixed_order import fixed_order_attention
from radixmesh.worker.deterministic import DETERMINISTIC_BLOCK
from radixmesh.worker.engine import Engine
from radixmesh.worker.layers.dense import dense_batch_invariant, onednn_packing_available

# (out, in) of smollm2's projections (q/o, gate/up, down) and a small one.
SHAPES = [(576, 576), (3072, 576), (576, 1536), (64, 64)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("packed", [False, True])
def test_cpu_gemm_rows_do_not_depend_on_the_row_count(dtype: torch.dtype, packed: bool) -> None:
    if packed and not onednn_packing_available(dtype):
        pytest.skip(f"oneDNN does not pack {dtype} on this CPU (bf16 needs AVX-512)")
    gen = torch.Generator().manual_seed(0)
    for n, k in SHAPES:
        w = torch.randn(n, k, generator=gen).to(dtype)
        x = torch.randn(40, k, generator=gen).to(dtype)
        p = torch.ops.mkldnn._reorder_linear_weight(w) if packed else None
        ref = dense_batch_invariant(x, w, None, p)  # [40, N]
        for m in range(1, 40):
            assert torch.equal(dense_batch_invariant(x[:m], w, None, p), ref[:m]), (n, k, m)
        # and the same rows inside other batches, at other positions
        for shift in (5, 20, 33):
            shuffled = torch.cat([x[shift:], x[:shift]])
            out = dense_batch_invariant(shuffled, w, None, p)[40 - shift :]
            assert torch.equal(out, ref[:shift]), (n, k, shift)
        close = F.linear(x.float(), w.float())
        torch.testing.assert_close(ref.float(), close, rtol=2e-2, atol=2e-2 * k**0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fixed_order_attention_is_the_same_sum_however_the_keys_are_split(
    dtype: torch.dtype,
) -> None:
    gen = torch.Generator().manual_seed(1)
    hq, hkv, d, n = 6, 2, 32, 150
    q = torch.randn(n, hq, d, generator=gen).to(dtype)
    k = torch.randn(hkv, n, d, generator=gen).to(dtype)
    v = torch.randn(hkv, n, d, generator=gen).to(dtype)
    pos = torch.arange(n)
    cold = fixed_order_attention(q[None], k[None], v[None], pos[None], 0.2)[0]  # [n, Hq, D]
    ref = F.scaled_dot_product_attention(
        q.float().transpose(0, 1)[None],
        k.float()[None],
        v.float()[None],
        is_causal=True,
        scale=0.2,
        enable_gqa=True,
    )[0].transpose(0, 1)
    torch.testing.assert_close(
        cold.float(),
        ref,
        rtol=1e-2 if dtype != torch.float32 else 1e-5,
        atol=1e-2 if dtype != torch.float32 else 1e-5,
    )
    # An extend over a cached prefix (aligned to the block or not) and a chunk of it.
    for prefix in (1, DETERMINISTIC_BLOCK - 1, DETERMINISTIC_BLOCK, 100):
        part = fixed_order_attention(q[None, prefix:], k[None], v[None], pos[None, prefix:], 0.2)
        assert torch.equal(part[0], cold[prefix:]), prefix
    chunk = fixed_order_attention(
        q[None, 70:90], k[None, :, :90], v[None, :, :90], pos[None, 70:90], 0.2
    )
    assert torch.equal(chunk[0], cold[70:90])
    # Decode rows batched with padding: each sees only its own keys, whatever follows.
    rows = [3, 64, 149]
    junk = torch.full((hkv, n, d), 7.0, dtype=dtype)
    keys = torch.stack([torch.cat([k[:, : r + 1], junk[:, r + 1 :]], 1) for r in rows])
    vals = torch.stack([torch.cat([v[:, : r + 1], junk[:, r + 1 :]], 1) for r in rows])
    out = fixed_order_attention(
        torch.stack([q[r : r + 1] for r in rows]), keys, vals, torch.tensor(rows)[:, None], 0.2
    )
    for i, r in enumerate(rows):
        assert torch.equal(out[i, 0], cold[r]), r


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    # A 64-token step budget: prompts past it are prefilled in chunks. The CPU path (on a
    # GPU machine too): CUDA's is checked in bf16 by bench/deterministic.py and the GPU tests.
    e = Engine(
        "dummy:tiny",
        device="cpu",
        dtype=request.param,
        deterministic=True,
        max_num_batched_tokens=DETERMINISTIC_BLOCK,
        kv_cache_tokens=8192,
    )
    yield e
    e.shutdown()


def test_single_prompt_at_every_batch_size(engine: Engine) -> None:
    vocab = engine.worker.arch.vocab_size
    assert run_single(engine, vocab, [1, 2, 5, 9], 1, 40, 12) == {"tokens": 1, "exact": 1}


def test_mixed_lengths_batched_in_any_order(engine: Engine) -> None:
    vocab = engine.worker.arch.vocab_size
    assert run_mixed(engine, vocab, [5, 30, 64, 100, 170], 3, 12) == {"tokens": 1, "exact": 1}


def test_cached_prefixes_give_the_cold_outputs(engine: Engine) -> None:
    vocab = engine.worker.arch.vocab_size
    got = run_prefix(engine, vocab, [1, 63, 64, 130, 257], 2, 12)
    per = {
        n: (c["tokens"], c["exact"], c["first_divergence"]) for n, c in got["per_prefix"].items()
    }
    assert (got["tokens"], got["exact"]) == (1, 1)
    assert per == {str(n): (1, 1, None) for n in (1, 63, 64, 130, 257)}
    cached = run_cached(engine, vocab, 8, 50, 12)
    assert cached == {"prompts": 8, "equal_tokens": 8, "equal_exact": 8}


def test_cached_prefixes_are_cut_at_the_block(engine: Engine) -> None:
    engine.flush_cache()
    prompt = list(range(10, 160))  # 150 tokens
    greedy = {"temperature": 0.0, "max_new_tokens": 1}
    engine.generate(input_ids=prompt, sampling_params=greedy)
    again = engine.generate(input_ids=[*prompt[:140], 5, 6], sampling_params=greedy)
    assert isinstance(again, dict)
    # 140 tokens are cached; the match stops at the last multiple of the block.
    assert again["meta_info"]["cached_tokens"] == 2 * DETERMINISTIC_BLOCK


def test_a_step_budget_below_the_block_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="max_num_batched_tokens"):
        Engine("dummy:tiny", deterministic=True, max_num_batched_tokens=DETERMINISTIC_BLOCK - 1)


def test_deterministic_is_an_engine_flag() -> None:
    from radixmesh.cluster.cli import add_engine_options, engine_options

    ap = argparse.ArgumentParser()
    add_engine_options(ap)
    assert engine_options(ap.parse_args(["--deterministic"]))["deterministic"] is True
    assert engine_options(ap.parse_args([]))["deterministic"] is False

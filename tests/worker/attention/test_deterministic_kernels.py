"""Deterministic mode's Triton kernels (CPU through TRITON_INTERPRET=1, or CUDA): the
batch-invariant matmul (split-K and inline paths alike, bit for bit) gives each row the
same bits whatever the batch, and stays close to torch's float32 reference; the extend
kernel with absolute tiles gives a token the same bits decoded, prefilled in any chunk or
beside other sequences; with one tile configuration and without them, a cached prefix
aligned to the tile gets the cold prefill's bits."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import triton  # noqa: F401  (a dev dependency: missing must fail, not skip)

from radixmesh.worker.attention.kernels.extend_attention import (
    LONG_EXTEND,
    ExtendConfig,
    extend_attention,
    extend_attention_ref,
    extend_config,
)
from radixmesh.worker.attention.triton_backend import deterministic_decode_config
from radixmesh.worker.layers.kernels.batch_invariant_matmul import (
    MatmulConfig,
    default_split_k,
    linear,
    slices,
)
from tests.worker.attention.test_triton_kernels import DEVICE, TOL, ints, make_pool_case, rel_err

# Small tiles for the interpreter (>= 16 for tl.dot); the kernels' logic is the same.
SMALL = MatmulConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2)
# fp16 stands for the half types here: the interpreter's bf16 tl.dot is wrong (see
# test_triton_kernels.py); bf16 runs on the GPU.
DTYPES = [torch.float32, torch.float16]
# bf16 too where the bits are all that is compared (the interpreter's bf16 dot is wrong, but
# wrong the same way on both paths and at every M).
BITS_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_rows_do_not_depend_on_the_batch(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(70, 48, generator=gen).to(DEVICE, dtype)  # N, K not multiples of the tile
    b = torch.randn(70, generator=gen).to(DEVICE, dtype)
    x = torch.randn(37, 48, generator=gen).to(DEVICE, dtype)
    ref = linear(x, w, b, cfg=SMALL, num_programs=3)  # [37, 70]
    for m in (1, 2, 15, 16, 17, 33):
        assert torch.equal(linear(x[:m], w, b, cfg=SMALL, num_programs=3), ref[:m]), m
    # Rows moved to other tiles, with other programs walking the tiles. Each keeps its row
    # within the tile: the interpreter's dot is numpy's matmul, whose BLAS kernel may sum a
    # tile's rows in different orders by their index (OpenBLAS on AMD EPYC does); the GPU's
    # matrix instructions treat every row of a tile alike.
    moved = torch.cat([x[16:32], x[:16], x[32:]])
    assert torch.equal(linear(moved, w, b, cfg=SMALL, num_programs=2)[16:32], ref[:16])
    expected = x.double() @ w.double().T + b.double()
    assert rel_err(ref, expected) < TOL[dtype]


@pytest.mark.parametrize("dtype", BITS_DTYPES)
def test_absolute_tiles_give_a_token_the_same_bits_decoded_or_prefilled(
    dtype: torch.dtype,
) -> None:
    """One sequence of 150 tokens (GQA, 8-token query blocks, 16-key tiles): prefilled
    cold, in chunks cut anywhere, and each token alone as a decode row (a one-token extend
    at its position), alone and beside another sequence: the same bits everywhere."""
    cfg = ExtendConfig(block_rows=16, block_n=16, num_warps=4, num_stages=2)
    hq, hkv, d, n = 4, 2, 16, 150
    c = make_pool_case([(0, n), (0, 40)], hq, hkv, d, dtype, seed=13, ctx=n)
    scale = d**-0.5

    def run(spans: list[tuple[int, int, int]]) -> torch.Tensor:
        """(sequence, start, end) spans of new tokens, one extend call."""
        offsets = [0, n]  # each sequence's first row in c["q"]
        q = torch.cat([c["q"][offsets[i] + a : offsets[i] + e] for i, a, e in spans])
        out = torch.full_like(q, float("nan"))
        starts = [0]
        for _, a, e in spans[:-1]:
            starts.append(starts[-1] + e - a)
        rows = ints([c["rows"][i] for i, _, _ in spans])
        prefixes = ints([a for _, a, _ in spans])
        lens = ints([e - a for _, a, e in spans])
        longest = max(e - a for _, a, e in spans)
        return extend_attention(
            q, c["k_buf"], c["v_buf"], out, c["table"], rows, prefixes, lens, ints(starts),
            longest, scale, config=cfg, absolute_tiles=True,
        )  # fmt: skip

    cold = run([(0, 0, n)])
    if dtype != torch.bfloat16:  # the interpreter's bf16 dot is wrong (see above)
        ref = extend_attention_ref(
            c["q"][:n], c["k_buf"], c["v_buf"], c["table"], c["rows"][:1], [0], [n], scale
        )
        assert rel_err(cold, ref) < TOL[dtype]
    chunks = [(0, 37), (37, 100), (100, 101), (101, 150)]
    assert torch.equal(torch.cat([run([(0, a, e)]) for a, e in chunks]), cold)
    for p in (0, 1, 7, 8, 15, 16, 17, 31, 63, 64, 100, 149):
        assert torch.equal(run([(0, p, p + 1)])[0], cold[p]), p
    beside = run([(1, 0, 40), (0, 70, 71), (1, 3, 4)])  # row 40 is token 70
    assert torch.equal(beside[40], cold[70])


@pytest.mark.parametrize("dtype", BITS_DTYPES)
def test_decode_only_tiles_give_a_decode_row_the_prefill_tiles_bits(dtype: torch.dtype) -> None:
    """Deterministic mode's decode-only batches run one warpgroup's share of the extend
    tiles (`deterministic_decode_config`): a batch of decode rows of one sequence at many
    positions gets the bits of its cold prefill with the extend tiles. On the GPU at
    Llama-3-8B's heads with the engine's tiles (8 warps: two warpgroups of 64 rows, against
    one); in the interpreter with small ones."""
    if DEVICE == "cuda":
        cfg = extend_config(LONG_EXTEND, 128)
        hq, hkv, d, n = 32, 8, 128, 700
    else:
        cfg = ExtendConfig(block_rows=32, block_n=16, num_warps=8, num_stages=2)
        hq, hkv, d, n = 4, 2, 16, 150
    dec_cfg = deterministic_decode_config(cfg)
    assert dec_cfg.block_rows * 2 == cfg.block_rows and dec_cfg.block_n == cfg.block_n
    c = make_pool_case([(0, n)], hq, hkv, d, dtype, seed=14, num_slots=2 * n, ctx=n)
    scale = d**-0.5
    rows = ints(c["rows"])
    cold = extend_attention(
        c["q"], c["k_buf"], c["v_buf"], torch.full_like(c["q"], float("nan")), c["table"],
        rows, ints([0]), ints([n]), ints([0]), n, scale, config=cfg, absolute_tiles=True,
    )  # fmt: skip
    at = [p for p in (0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 300) if p < n] + [n - 1]
    k = len(at)
    q = c["q"][at]
    dec = extend_attention(
        q, c["k_buf"], c["v_buf"], torch.full_like(q, float("nan")), c["table"],
        rows.repeat(k), ints(at), ints([1] * k), ints(list(range(k))), 1, scale,
        config=dec_cfg, absolute_tiles=True,
    )  # fmt: skip
    for i, p in enumerate(at):
        assert torch.equal(dec[i], cold[p]), p


@pytest.mark.parametrize("dtype", DTYPES)
def test_extend_over_an_aligned_cached_prefix_equals_the_cold_prefill(dtype: torch.dtype) -> None:
    """One sequence of 80 tokens: cold (prefix 0), and its last 48 over a 32-token cached
    prefix (a multiple of the 16-key tile), and in two chunks of 16 + 32."""
    cfg = ExtendConfig(block_rows=16, block_n=16, num_warps=4, num_stages=2)
    hq, hkv, d, n = 4, 2, 16, 80
    c = make_pool_case([(0, n)], hq, hkv, d, dtype, seed=12, ctx=n)
    rows, scale = ints(c["rows"]), d**-0.5

    def run(prefix: int, end: int) -> torch.Tensor:
        q = c["q"][prefix:end]
        out = torch.full_like(q, float("nan"))
        return extend_attention(
            q, c["k_buf"], c["v_buf"], out, c["table"], rows, ints([prefix]),
            ints([end - prefix]), ints([0]), end - prefix, scale, config=cfg,
        )  # fmt: skip

    cold = run(0, n)
    assert torch.equal(run(32, n), cold[32:])
    assert torch.equal(run(32, 48), cold[32:48])
    assert torch.equal(run(48, n), cold[48:])


def test_matmul_config_takes_a_sweeps_table_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table written by bench.deterministic_matmul replaces TABLE for half types only;
    shapes it does not name keep the rule."""
    from radixmesh.worker.layers.kernels import batch_invariant_matmul as bim

    path = f"{tmp_path}/table.json"
    with open(path, "w") as f:
        f.write('[{"n": 96, "k": 64, "block_m": 64, "block_n": 32, "block_k": 32, '
                '"group_m": 4, "num_warps": 4, "num_stages": 2}]')  # fmt: skip
    monkeypatch.setenv(bim.TABLE_ENV, path)
    assert bim.config(96, 64, torch.bfloat16) == MatmulConfig(64, 32, 32, 4, 4, 2)
    assert bim.config(96, 64, torch.float32) == MatmulConfig(128, 128, 32, 8, 8, 3)
    assert bim.config(256, 64, torch.bfloat16) == MatmulConfig(128, 128, 64, 8, 8, 3)
    monkeypatch.delenv(bim.TABLE_ENV)
    assert bim.config(96, 64, torch.bfloat16) == MatmulConfig(128, 128, 64, 8, 8, 3)


@pytest.mark.parametrize("dtype", BITS_DTYPES)
@pytest.mark.parametrize("split_k", [1, 2, 3])
@pytest.mark.parametrize("with_bias", [True, False])
def test_split_and_inline_matmul_paths_give_the_same_bits_at_every_m(
    dtype: torch.dtype, split_k: int, with_bias: bool
) -> None:
    """K = 72 is not a multiple of S x BLOCK_K for S = 2, 3 (slices of 48 + 24 and of
    32 + 32 + 8): the short last slice is masked alike on both paths."""
    cfg = replace(SMALL, split_k=split_k)
    assert slices(72, cfg) == {1: (80, 1), 2: (48, 2), 3: (32, 3)}[split_k]
    gen = torch.Generator().manual_seed(split_k)
    w = torch.randn(40, 72, generator=gen).to(DEVICE, dtype)
    b = torch.randn(40, generator=gen).to(DEVICE, dtype) if with_bias else None
    x = torch.randn(35, 72, generator=gen).to(DEVICE, dtype)
    ref = linear(x, w, b, cfg=cfg, num_programs=3, path="inline")  # [35, 40]
    assert torch.equal(linear(x, w, b, cfg=cfg, path="split"), ref)
    for m in (1, 17, 34):
        assert torch.equal(linear(x[:m], w, b, cfg=cfg, path="split"), ref[:m]), m
        assert torch.equal(linear(x[:m], w, b, cfg=cfg, num_programs=2, path="inline"), ref[:m])
    # auto: the split kernel for 1 row (one tile, fewer than 2 x 4 programs), inline for 35.
    assert torch.equal(linear(x[:1], w, b, cfg=cfg, num_programs=4), ref[:1])
    if dtype != torch.bfloat16:
        expected = x.double() @ w.double().T + (b.double() if b is not None else 0.0)
        assert rel_err(ref, expected) < TOL[dtype]


def test_split_matmul_rows_are_the_inline_rows_of_a_larger_batch() -> None:
    """Rows moved to other positions and tiles: the split path on 20 rows equals the
    inline path's rows of a 37-row batch."""
    cfg = replace(SMALL, split_k=2)
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(70, 48, generator=gen).to(DEVICE, torch.float16)
    x = torch.randn(37, 48, generator=gen).to(DEVICE, torch.float16)
    ref = linear(x, w, cfg=cfg, num_programs=3, path="inline")
    moved = torch.cat([x[20:], x[:20]])
    assert torch.equal(linear(moved, w, cfg=cfg, path="split")[17:], ref[:20])


def test_default_split_k_depends_on_n_and_k_only() -> None:
    """Llama-3-8B's shapes with 128 x 128 x 64 tiles: 2 x 132 programs at 256 rows."""
    assert default_split_k(4096, 14336, 128, 128, 64) == 4  # down: 32 x 2 tiles
    assert default_split_k(4096, 4096, 128, 128, 64) == 4  # o
    assert default_split_k(6144, 4096, 128, 128, 64) == 3  # qkv: 48 x 2 tiles
    assert default_split_k(28672, 4096, 128, 128, 64) == 1  # gate_up: 224 x 2 tiles
    assert default_split_k(4096, 256, 128, 128, 64) == 1  # 4 BLOCK_K steps: one slice
    with pytest.raises(ValueError, match="split_k"):
        slices(64, replace(SMALL, split_k=0))

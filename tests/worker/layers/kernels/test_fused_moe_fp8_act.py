"""The grouped-GEMM experts' w8a8 path (layers/kernels/fused_moe.py): FP8 activations,
quantized on the device per (row, group of the weights' bk columns) or per row, times FP8
weights, against PyTorch quantizing the activations the same way (`quantize_rows` of the
same groups) and multiplying the dequantized values in float64: only the order of the
float32 sums differs. Triton's interpreter runs an e4m3 x e4m3 `tl.dot` on CPU (products
exact, float32 sums), so the kernel runs here; the CUDA test checks the compiled FP8 MMA
with bf16 activations and no host sync. Also: the quantizer's bits, and the host's
choice of path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixmesh.worker.layers.kernels.fused_moe import (
    FP8_CONFIGS,
    MIN_FP8_BLOCK_K,
    W8A8_MIN_MEAN_ROWS,
    GemmConfig,
    _down_input,
    align,
    fused_experts,
    gemm_config,
    moe_gemm,
    quantize_activations,
    use_fp8_activations,
)
from radixmesh.worker.layers.kernels.silu_mul import silu_and_mul
from radixmesh.worker.layers.quantization.fp8_experts import BlockScales, dequantize
from radixmesh.worker.layers.quantization.fp8_scales import FP8, quantize_rows
from tests.worker.layers.kernels.test_fused_moe_fp8 import fp8_experts

interpreter = pytest.mark.skipif(
    torch.cuda.is_available(), reason="triton's interpreter on CPU tensors: machines without CUDA"
)
Block = tuple[int, int]
H, I = 256, 256  # both multiples of 128: 128 x 128 blocks split K into whole groups
LAYOUTS = {  # (w13's block, w2's block)
    "128x128": ((128, 128), (128, 128)),  # an FP8 checkpoint's: 1 x 128 activation groups
    "rows": ((1, H), (1, I)),  # quantized at load: one activation scale a row
    "tp-blocks": ((1, 128), (128, 64)),  # a rank's: w2's groups of 64 columns
}
CASES = [(37, 6, 2), (1, 8, 2), (9, 16, 4), (50, 4, 1)]  # tokens, experts, top k


def quantize_ref(x: torch.Tensor, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (e4m3, scales [T, groups]): `quantize_rows` of each group of bk columns
    (one group where bk >= K)."""
    t, k = x.shape
    group = min(bk, k)
    q, s = quantize_rows(x.reshape(-1, group))
    return q.view(t, k), s.view(t, -1)


def dequantize_ref(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """e4m3 [T, K] and their group scales [T, groups] -> float64 values."""
    group = q.shape[1] // s.shape[1]
    return q.double() * s.double().repeat_interleave(group, dim=1)


def w8a8_ref(
    x: torch.Tensor,
    q13: torch.Tensor,
    q2: torch.Tensor,
    scales: tuple[BlockScales, BlockScales],
    experts: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """The w8a8 path in PyTorch: x quantized per token, gate/up in float64 rounded to x's
    dtype, SiLU-and-mul in x's dtype, quantized per pair, down in float64 times the pair's
    weight, summed over each token's pairs."""
    t, top_k = experts.shape
    w13, w2 = (dequantize(q, s).double() for q, s in zip((q13, q2), scales, strict=True))
    a = dequantize_ref(*quantize_ref(x, scales[0].block[1]))  # [T, H]
    e = experts.flatten()
    gate_up = torch.einsum("ph,pnh->pn", a.repeat_interleave(top_k, 0), w13[e]).to(x.dtype)
    i = gate_up.shape[1] // 2
    h = F.silu(gate_up[:, :i]) * gate_up[:, i:]  # [T * k, I]
    h64 = dequantize_ref(*quantize_ref(h, scales[1].block[1]))
    down = torch.einsum("pi,phi->ph", h64, w2[e]) * weights.flatten()[:, None].double()
    return down.view(t, top_k, -1).sum(dim=1).to(x.dtype)


@interpreter
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(("t", "e", "k"), CASES)
def test_w8a8_experts_match_pytorch_quantizing_the_activations_alike(
    layout: str, t: int, e: int, k: int
) -> None:
    q13, q2, scales, moe = fp8_experts(H, I, e, k, LAYOUTS[layout], torch.float32)
    x = torch.randn(t, H, generator=torch.Generator().manual_seed(t))
    experts, weights = moe.route(x)
    got = fused_experts(x, q13, q2, experts, weights, scales=scales, fp8_activations=True)
    want = w8a8_ref(x, q13, q2, scales, experts, weights)
    # The same e4m3 products in another order of float32 sums: 2e-7 of the largest value.
    # Except where that order moves a gate/up sum across a rounding boundary and the SiLU
    # product's e4m3 value (or its group's scale) falls the other way than the
    # reference's: that moves one term of one token's row by about 1/16 of itself (4e-4
    # of the largest value, once here: 50 tokens, top 1, per-row scales); a misplaced
    # scale moves every row by its own size.
    scale = float(want.abs().max())
    row_diff = (got - want).abs().amax(dim=1)  # [T]
    assert int((row_diff > 1e-6 * scale).sum()) <= 1, row_diff / scale
    torch.testing.assert_close(got, want, rtol=0.0, atol=1e-3 * scale)
    # The weight-only path's output is off that reference by e4m3's rounding of the
    # activations (4-7% of the largest value): the path above did quantize them.
    weight_only = fused_experts(x, q13, q2, experts, weights, scales=scales, fp8_activations=False)
    assert float((weight_only - want).abs().max()) > 0.02 * scale


def _pairs_ref(
    a: torch.Tensor, w: torch.Tensor, experts: torch.Tensor, a_by_token: bool
) -> torch.Tensor:
    """Each pair's row of `a` (float64) times its expert's w^T (float64) [P, N]."""
    top_k = experts.shape[1]
    rows = a.repeat_interleave(top_k, 0) if a_by_token else a
    return torch.einsum("pk,pnk->pn", rows, w[experts.flatten()])


@interpreter
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("a_by_token", [True, False])
@pytest.mark.parametrize(
    "config", [GemmConfig(16, 32, 128, 8, 4), GemmConfig(64, 128, 64, 4, 3)], ids=str
)
def test_one_w8a8_gemm_is_the_quantized_product_to_float32_sums(
    layout: str, a_by_token: bool, config: GemmConfig
) -> None:
    """moe_gemm alone on given e4m3 rows and scales, either input layout (a token's row
    for its pairs, the pairs' own rows), a 64-deep step inside 128-column groups."""
    t, e, top_k = 21, 5, 3
    q13, _, scales, _ = fp8_experts(H, I, e, top_k, LAYOUTS[layout], torch.float32)
    gen = torch.Generator().manual_seed(3)
    experts = torch.stack([torch.randperm(e, generator=gen)[:top_k] for _ in range(t)])
    a = torch.randn(t if a_by_token else t * top_k, H, generator=gen)
    a8, a_s = quantize_ref(a, scales[0].block[1])
    sorted_ids, block_experts = align(experts, e, config.block_m)
    pair_weights = torch.rand(t * top_k, generator=gen)
    got = moe_gemm(
        a8,
        q13,
        sorted_ids,
        block_experts,
        top_k=top_k,
        num_pairs=t * top_k,
        a_by_token=a_by_token,
        pair_weights=pair_weights,
        out_dtype=torch.float32,
        config=config,
        w_scales=scales[0],
        a_scales=a_s,
    )
    w = dequantize(q13, scales[0]).double()
    want = _pairs_ref(dequantize_ref(a8, a_s), w, experts, a_by_token)
    want = (want * pair_weights[:, None].double()).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


@interpreter
@pytest.mark.parametrize("bk", [128, 64, 512])
def test_activations_quantize_per_group_as_quantize_rows_does(bk: int) -> None:
    """Bit for bit: e4m3 values and scales of each group of bk columns (one group a row
    where bk >= K), a zero group included (scale 1e-12, values 0)."""
    x = torch.randn(7, 256, generator=torch.Generator().manual_seed(bk)) * 30
    x[2, :128] = 0.0
    q, s = quantize_activations(x, BlockScales(torch.ones(1, 1, 1), (128, bk)))
    want_q, want_s = quantize_ref(x, bk)
    assert s.shape == (7, max(256 // bk, 1))
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(s, want_s)


@interpreter
@pytest.mark.parametrize("block", [(128, 64), (1, 128)])
def test_the_down_input_is_the_product_quantized_for_w2s_blocks(block: Block) -> None:
    """SiLU-and-mul's product [P, I = 128] quantized per 64-column group (the product, then
    the quantizer) or per pair (silu_and_mul's quantizing kernel): quantize_rows' bits."""
    gate_up = torch.randn(11, 256, generator=torch.Generator().manual_seed(4)) * 4
    q, s = _down_input(gate_up, BlockScales(torch.ones(1, 1, 1), block))
    want_q, want_s = quantize_ref(silu_and_mul(gate_up), block[1])
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert s is not None and torch.equal(s, want_s)


def _meta(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.empty(shape, dtype=FP8, device="meta")


def _qwen3(
    blocks: tuple[Block, Block],
) -> tuple[torch.Tensor, torch.Tensor, tuple[BlockScales, BlockScales]]:
    """Qwen3-30B-A3B's expert weights (E 128, H 2048, I 768) on the meta device, scales
    for `blocks` (only their blocks are read)."""
    one = torch.ones(1, 1, 1)
    scales = (BlockScales(one, blocks[0]), BlockScales(one, blocks[1]))
    return _meta((128, 1536, 2048)), _meta((128, 2048, 768)), scales


def test_the_w8a8_path_from_a_mean_of_4_rows_an_expert_where_the_blocks_fit() -> None:
    assert W8A8_MIN_MEAN_ROWS == 4 and MIN_FP8_BLOCK_K == 32
    w13, w2, blocks = _qwen3(((128, 128), (128, 128)))
    # top 8 of 128 experts: 64 tokens are 4 rows an expert
    assert [use_fp8_activations(t, 8, w13, w2, blocks) for t in (1, 63, 64, 2048)] == [
        False,
        False,
        True,
        True,
    ]
    assert not use_fp8_activations(2048, 8, w13, w2, None)  # 16-bit weights
    for fit in [((1, 2048), (1, 768)), ((1, 128), (128, 96)), ((128, 128), (128, 32))]:
        assert use_fp8_activations(64, 8, *_qwen3(fit))
    # K steps of 16 columns (8 ranks' I = 96: blocks of gcd(96, 128) = 32 fit; 16 do not)
    # and groups that do not divide K (1 x 96 blocks of H = 2048) take weight-only.
    for unfit in [((128, 128), (128, 16)), ((1, 96), (1, 768))]:
        assert not use_fp8_activations(2048, 8, *_qwen3(unfit))


def test_the_w8a8_tiles_step_128_columns_one_scale_block() -> None:
    assert all(config.block_k == 128 for _, config in FP8_CONFIGS)
    assert gemm_config(256, 8, 128, fp8_activations=True) == FP8_CONFIGS[1][1]
    assert gemm_config(256, 8, 128) == GemmConfig(16, 64, 128, 4, 4)  # bf16's table


def test_fp8_activations_asked_for_blocks_that_do_not_fit_are_refused() -> None:
    q13, q2, scales, moe = fp8_experts(192, 160, 4, 2, ((128, 128), (128, 128)), torch.float32)
    x = torch.randn(3, 192)
    experts, weights = moe.route(x)
    with pytest.raises(ValueError, match="FP8 activations need FP8 weights whose blocks fit"):
        fused_experts(x, q13, q2, experts, weights, scales=scales, fp8_activations=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("t", [1, 16, 300])
def test_w8a8_experts_on_cuda_match_the_reference_and_never_wait_for_the_device(
    layout: str, t: int
) -> None:
    """bfloat16 activations into the compiled FP8 MMA, forced onto the w8a8 path at every
    row count, against `w8a8_ref` on the same device. The bf16 roundings of gate/up and of
    the SiLU product may fall the other way in the kernel (float32 sums in another order,
    the GPU's exp) and move a quantized value by one e4m3 step (1/8 of it); where the
    flipped value is a row's largest, the row's scale moves and every value of the row is
    quantized again, so a flip can move a whole token's outputs. At 300 tokens 4-33 of
    76,800 outputs moved by up to 2.4% of the largest one (an H100, 2026-12-06), 99 in
    the per-row layout (an H200, the same day). So the bounds are on the whole: the
    relative L2 error under 1%, no output off by 5% of the largest, at most 1% of outputs
    off by 1%. A misplaced scale or row is off by its own size in every output it
    touches: one token of 300 wrong is ~6% relative L2 error and a max error of order
    the largest output, caught by the first two."""
    q13, q2, scales, moe = fp8_experts(H, I, 16, 4, LAYOUTS[layout], torch.bfloat16)
    q13, q2, moe = q13.cuda(), q2.cuda(), moe.cuda()
    scales = (
        BlockScales(scales[0].scale.cuda(), scales[0].block),
        BlockScales(scales[1].scale.cuda(), scales[1].block),
    )
    x = torch.randn(t, H, generator=torch.Generator().manual_seed(5)).bfloat16().cuda()
    experts, weights = moe.route(x)
    want = w8a8_ref(x, q13, q2, scales, experts, weights)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = fused_experts(x, q13, q2, experts, weights, scales=scales, fp8_activations=True)
        auto = fused_experts(x, q13, q2, experts, weights, scales=scales)  # the choice's path
    finally:
        torch.cuda.set_sync_debug_mode("default")
    scale = float(want.float().abs().max())
    diff = (got.float() - want.float()).abs()
    assert float(diff.norm() / want.float().norm()) < 0.01
    assert float(diff.max()) < 0.05 * scale
    assert int((diff > 0.01 * scale).sum()) <= max(1, diff.numel() // 100)
    eager = moe.forward_eager(x, experts, weights).float()  # bf16, dequantized weights
    assert float((auto.float() - eager).abs().max()) < 0.1 * scale

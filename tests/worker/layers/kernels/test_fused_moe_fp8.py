"""The grouped-GEMM experts with FP8 weights (layers/kernels/fused_moe.py): e4m3 values
and block scales (128 x 128, per row and the finer blocks tensor parallelism holds)
against PyTorch computing with the dequantized weights (SparseMoE's float32 path), in
triton's interpreter on CPU (conftest.py) or compiled on CUDA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixmesh.worker.layers.kernels.fused_moe import (
    SCALE_AFTER_K,
    SCALE_PER_K_STEP,
    GemmConfig,
    _weight_scaling,
    fused_experts,
)
from radixmesh.worker.layers.moe import SparseMoE
from radixmesh.worker.layers.quantization.fp8_experts import BlockScales, dequantize, expand_blocks
from radixmesh.worker.layers.quantization.fp8_scales import FP8, FP8_MAX

interpreter = pytest.mark.skipif(
    torch.cuda.is_available(), reason="triton's interpreter on CPU tensors: machines without CUDA"
)
Block = tuple[int, int]


def quantize(w: torch.Tensor, block: Block) -> tuple[torch.Tensor, BlockScales]:
    """w [E, N, K] -> e4m3 and one scale per block: max |block| / 448."""
    (e, n, k), (bn, bk) = w.shape, block
    nb, kb = -(-n // bn), -(-k // bk)
    padded = F.pad(w.abs(), (0, kb * bk - k, 0, nb * bn - n))
    scale = (padded.reshape(e, nb, bn, kb, bk).amax(dim=(2, 4)) / FP8_MAX).clamp_min(1e-12)
    q = (w / expand_blocks(scale, block, n, k)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, BlockScales(scale, block)


def fp8_experts(
    h: int, i: int, e: int, k: int, blocks: tuple[Block, Block], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, tuple[BlockScales, BlockScales], SparseMoE]:
    """(w13, w2 in e4m3, their scales, a SparseMoE in `dtype` holding the dequantized
    weights and a router)."""
    gen = torch.Generator().manual_seed(h + i + e)
    q13, s13 = quantize(0.3 * torch.randn(e, 2 * i, h, generator=gen), blocks[0])
    q2, s2 = quantize(0.3 * torch.randn(e, h, i, generator=gen), blocks[1])
    moe = SparseMoE(h, i, e, k, renormalize=True, dtype=dtype)
    moe.gate.weight.data.copy_(torch.randn(e, h, generator=gen).to(dtype))
    moe.w13.data.copy_(dequantize(q13, s13).to(dtype))
    moe.w2.data.copy_(dequantize(q2, s2).to(dtype))
    return q13, q2, (s13, s2), moe


LAYOUTS = {  # (w13's block, w2's block) for hidden 192, intermediate 160
    "128x128": ((128, 128), (128, 128)),  # an FP8 checkpoint's: partial blocks at the edges
    "rows": ((1, 192), (1, 160)),  # quantized at load: one scale per row, after the K loop
    "tp-fallback": ((1, 128), (128, 32)),  # a rank off the checkpoint's blocks
}
CASES = [(37, 6, 2), (1, 8, 2), (9, 16, 4), (50, 4, 1)]  # tokens, experts, top k


@interpreter
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(("t", "e", "k"), CASES)
def test_fp8_experts_match_pytorch_with_the_dequantized_weights(
    layout: str, t: int, e: int, k: int
) -> None:
    q13, q2, scales, moe = fp8_experts(192, 160, e, k, LAYOUTS[layout], torch.float32)
    x = torch.randn(t, 192, generator=torch.Generator().manual_seed(t))
    experts, weights = moe.route(x)
    got = fused_experts(x, q13, q2, experts, weights, scales=scales, fp8_activations=False)
    want = moe.forward_eager(x, experts, weights)
    # The same products summed in another order (weight-only: the tiles dequantized as
    # the eager path's weights are, or per-row scales applied to the float32 sums).
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


@interpreter
@pytest.mark.parametrize(
    "config", [GemmConfig(16, 32, 128, 8, 4), GemmConfig(64, 128, 64, 8, 3)], ids=str
)
def test_tiles_deeper_than_a_scale_block_step_within_it(config: GemmConfig) -> None:
    """128- and 64-deep tiles over blocks of 32 columns take 32-column K steps."""
    q13, q2, scales, moe = fp8_experts(192, 160, 6, 2, LAYOUTS["tp-fallback"], torch.float32)
    x = torch.randn(37, 192, generator=torch.Generator().manual_seed(2))
    experts, weights = moe.route(x)
    got = fused_experts(x, q13, q2, experts, weights, config, scales=scales)
    want = moe.forward_eager(x, experts, weights)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


def test_the_k_step_never_spans_two_scale_blocks() -> None:
    w = torch.zeros(2, 64, 160, dtype=FP8)

    def scaling(block: Block, block_k: int) -> tuple[int, int, int, int]:
        nb, kb = -(-64 // block[0]), -(-160 // block[1])
        return _weight_scaling(w, BlockScales(torch.ones(2, nb, kb), block), block_k)

    assert scaling((128, 128), 64) == (SCALE_PER_K_STEP, 128, 128, 64)
    assert scaling((128, 32), 128) == (SCALE_PER_K_STEP, 128, 32, 32)
    assert scaling((1, 160), 128) == (SCALE_AFTER_K, 1, 160, 128)  # a block spans K
    with pytest.raises(ValueError, match="no K step of at least 16"):
        scaling((1, 8), 64)
    with pytest.raises(ValueError, match=r"need float8_e4m3fn and scales \(2, 1, 2\), got"):
        _weight_scaling(w, BlockScales(torch.ones(2, 1, 3), (128, 128)), 64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("t", [1, 16, 300])
def test_fp8_experts_on_cuda_match_the_reference_and_never_wait_for_the_device(
    layout: str, t: int
) -> None:
    """bfloat16 activations (the interpreter's bfloat16 tl.dot is wrong, so only here),
    Qwen3-30B-A3B-like widths, the weight-only path at every row count (the automatic
    choice takes FP8 activations for large steps: test_fused_moe_fp8_act.py). The eager
    path rounds the dequantized weights to bfloat16, the kernel each weight tile (or, per
    row, scales the float32 sums): each is measured against float64 over the same e4m3
    weights and routing, the kernel no less exact."""
    blocks = {"rows": ((1, 256), (1, 384))}.get(layout, LAYOUTS[layout])
    q13, q2, scales, moe = fp8_experts(256, 384, 16, 4, blocks, torch.bfloat16)
    q13, q2, moe = q13.cuda(), q2.cuda(), moe.cuda()
    scales = (
        BlockScales(scales[0].scale.cuda(), scales[0].block),
        BlockScales(scales[1].scale.cuda(), scales[1].block),
    )
    x = torch.randn(t, 256, generator=torch.Generator().manual_seed(5)).bfloat16().cuda()
    experts, weights = moe.route(x)
    want = moe.forward_eager(x, experts, weights)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = fused_experts(x, q13, q2, experts, weights, scales=scales, fp8_activations=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    w13, w2 = (dequantize(q, s).double() for q, s in zip((q13, q2), scales, strict=True))
    ref = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in range(16):
        tokens, choice = (experts == e).nonzero(as_tuple=True)
        gate, up = (x[tokens].double() @ w13[e].T).chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ w2[e].T
        ref.index_add_(0, tokens, y * weights[tokens, choice, None].double())
    eager_err = float((want.double() - ref).abs().max())
    fused_err = float((got.double() - ref).abs().max())
    assert fused_err <= 1.5 * eager_err + 1e-6, (fused_err, eager_err)
    torch.testing.assert_close(
        got.float(), want.float(), rtol=0.02, atol=0.01 * float(ref.abs().max())
    )

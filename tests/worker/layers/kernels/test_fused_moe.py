"""The grouped-GEMM experts (layers/kernels/fused_moe.py): `align`'s layout exactly, and
`fused_experts` against SparseMoE's PyTorch path (layers/moe.py), in triton's interpreter
on CPU (conftest.py) or compiled on CUDA."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.layers.kernels.fused_moe import (
    CONFIGS,
    GemmConfig,
    align,
    fused_experts,
    gemm_config,
)
from radixmesh.worker.layers.moe import SparseMoE

interpreter = pytest.mark.skipif(
    torch.cuda.is_available(), reason="triton's interpreter on CPU tensors: machines without CUDA"
)


def reference_layout(experts: list[list[int]], num_experts: int, block_m: int) -> list[int]:
    """Pairs (t * k + j) grouped by expert in pair order, each group padded to block_m
    with the sentinel T * k."""
    flat = [e for row in experts for e in row]
    sentinel = len(flat)
    out: list[int] = []
    for e in range(num_experts):
        group = [p for p, pe in enumerate(flat) if pe == e]
        out += group + [sentinel] * (-len(group) % block_m)
    return out


@pytest.mark.parametrize(
    ("experts", "num_experts"),
    [
        ([[0, 2], [2, 1], [0, 1], [2, 0]], 4),  # expert 3 has no pair
        ([[5]], 8),  # one token, top-1
        ([[i % 3, (i + 1) % 3] for i in range(40)], 3),  # groups longer than a block
    ],
)
def test_align_groups_and_pads_the_pairs_by_expert(
    experts: list[list[int]], num_experts: int
) -> None:
    block_m = 4
    sorted_ids, block_experts = align(torch.tensor(experts), num_experts, block_m)
    want = reference_layout(experts, num_experts, block_m)
    pairs = len(experts) * len(experts[0])
    size = -(-(pairs + num_experts * (block_m - 1)) // block_m) * block_m
    assert sorted_ids.tolist() == want + [pairs] * (size - len(want))
    flat = [e for row in experts for e in row]
    blocks = [
        flat[want[b * block_m]] if b * block_m < len(want) else -1 for b in range(size // block_m)
    ]
    assert block_experts.tolist() == blocks


def _moe(hidden: int, inter: int, num_experts: int, top_k: int, dtype: torch.dtype) -> SparseMoE:
    moe = SparseMoE(hidden, inter, num_experts, top_k, renormalize=True, dtype=dtype)
    gen = torch.Generator().manual_seed(hidden + inter + num_experts)
    for p in moe.parameters():
        p.data.copy_((0.3 * torch.randn(p.shape, generator=gen)).to(dtype))
    return moe


CASES = [  # tokens, hidden, expert intermediate size, experts, top k
    (37, 24, 20, 6, 2),  # sizes that are no multiple of a tile
    (1, 64, 32, 8, 2),  # one decode row: most experts idle
    (50, 32, 16, 4, 1),
    (9, 96, 48, 16, 4),
]


@interpreter
@pytest.mark.parametrize(("t", "h", "i", "e", "k"), CASES)
def test_fused_experts_match_the_pytorch_path_in_float32(
    t: int, h: int, i: int, e: int, k: int
) -> None:
    moe = _moe(h, i, e, k, torch.float32)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(t))
    experts, weights = moe.route(x)
    got = fused_experts(x, moe.w13, moe.w2, experts, weights)
    want = moe.forward_eager(x, experts, weights)
    # The same products summed in another order (the tiles' against PyTorch's).
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


@interpreter
@pytest.mark.parametrize("config", [config for _, config in CONFIGS], ids=str)
def test_every_tile_config_of_the_table_gives_the_pytorch_path(config: GemmConfig) -> None:
    """Each of the table's tiles, whatever step size picks it, on rows that leave an
    expert more than one block and another none (37 tokens, 6 experts, 2 each)."""
    moe = _moe(24, 20, 6, 2, torch.float32)
    x = torch.randn(37, 24, generator=torch.Generator().manual_seed(2))
    experts, weights = moe.route(x)
    got = fused_experts(x, moe.w13, moe.w2, experts, weights, config)
    want = moe.forward_eager(x, experts, weights)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


def test_the_table_picks_by_the_mean_rows_an_expert_gets() -> None:
    # Qwen3-30B-A3B (128 experts, 8 a token) and Mixtral (8 experts, 2 a token).
    assert gemm_config(1, 8, 128) == CONFIGS[0][1]  # a decode row: 1/16 of a row an expert
    assert gemm_config(2048, 8, 128) == gemm_config(512, 2, 8)  # 128 rows an expert
    assert gemm_config(2048, 2, 8).block_m == CONFIGS[-1][1].block_m  # 512 rows an expert


def _experts_float64(
    moe: SparseMoE, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Each token's sum of its experts' SiLU-gated MLPs, weighted, in float64."""
    x, w13, w2, weights = x.double(), moe.w13.double(), moe.w2.double(), weights.double()
    out = torch.zeros_like(x)
    for e in range(moe.num_experts):
        tokens, choice = (experts == e).nonzero(as_tuple=True)
        gate, up = (x[tokens] @ w13[e].T).chunk(2, dim=-1)
        y = (torch.nn.functional.silu(gate) * up) @ w2[e].T
        out.index_add_(0, tokens, y * weights[tokens, choice, None])
    return out


def test_float64_reference_is_the_eager_path() -> None:
    """The reference the GPU test measures both paths against, checked against the eager
    path in float32 (the same products, summed in float32)."""
    moe = _moe(64, 32, 8, 2, torch.float32)
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(3))
    experts, weights = moe.route(x)
    want = moe.forward_eager(x, experts, weights)
    got = _experts_float64(moe, x, experts, weights)
    torch.testing.assert_close(got.float(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("config", [None] + [config for _, config in CONFIGS], ids=str)
def test_fused_experts_on_cuda_match_and_never_wait_for_the_device(
    config: GemmConfig | None,
) -> None:
    """bfloat16 (the interpreter's bfloat16 tl.dot is wrong, so only here): both paths
    round the gate/up and SiLU products and differ in where the down projection's output
    is rounded, by an ulp of outputs that reach ~300 (0.25 at 32-64: a fixed tolerance
    cannot tell that from an error). So each is measured against float64 over the same
    bfloat16 inputs, weights and routing: the kernel is no less exact than the eager
    path."""
    moe = _moe(256, 128, 16, 4, torch.bfloat16).cuda()
    x = torch.randn(300, 256, generator=torch.Generator().manual_seed(5)).bfloat16().cuda()
    experts, weights = moe.route(x)
    want = moe.forward_eager(x, experts, weights)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = fused_experts(x, moe.w13, moe.w2, experts, weights, config)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref = _experts_float64(moe, x, experts, weights)
    eager_err = float((want.double() - ref).abs().max())
    fused_err = float((got.double() - ref).abs().max())
    assert fused_err <= 1.5 * eager_err, (fused_err, eager_err)
    # The two paths agree to a few bfloat16 ulps of the output's scale.
    torch.testing.assert_close(
        got.float(), want.float(), rtol=0.02, atol=0.01 * float(ref.abs().max())
    )

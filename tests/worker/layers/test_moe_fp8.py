"""FP8 experts (layers/moe.py, `SparseMoE.use_fp8`): an FP8 checkpoint's expert weights
load bit for bit with their scales in blocks, under tensor parallelism too, and the
PyTorch path gives the model holding the dequantized weights exactly; a full-precision
checkpoint is quantized at load per row; scales that fit nothing are ValueErrors."""

from __future__ import annotations

import re

import pytest
import torch

from radixmesh.worker.layers.moe import SparseMoE
from radixmesh.worker.layers.parallel import TPGroup
from radixmesh.worker.layers.quantization import dequantize_linears
from radixmesh.worker.layers.quantization.fp8_experts import dequantize
from radixmesh.worker.layers.quantization.fp8_scales import (
    FP8,
    dequantize_checkpoint_weight,
    quantize_blocks,
    quantize_rows,
)
from radixmesh.worker.model.arch import LlamaArchConfig
from radixmesh.worker.model.llama import LlamaForCausalLM

H, E, K = 192, 4, 2  # hidden: groups of 128 and 64 columns


def checkpoint(inter: int, layout: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """An expert block's tensors (router, then each expert's gate/up/down), FP8 with
    their stored scales under `<name>_scale`: 128 x 128 blocks, per channel or per tensor."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {"gate.weight": torch.randn(E, H, generator=gen)}
    for e in range(E):
        for piece, shape in (("gate", (inter, H)), ("up", (inter, H)), ("down", (H, inter))):
            w = 0.3 * torch.randn(shape, generator=gen)
            name = f"{e}.{piece}"
            if layout == "128x128":
                tensors[name], tensors[f"{name}_scale"] = quantize_blocks(w, 128)
            elif layout == "channel":
                tensors[name], scale = quantize_rows(w)
                tensors[f"{name}_scale"] = scale[:, None]  # [out, 1], as checkpoints store it
            else:  # per tensor
                scale = w.abs().max() / 448
                tensors[name], tensors[f"{name}_scale"] = (w / scale).to(FP8), scale
    return tensors


def dequantized(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        n: dequantize_checkpoint_weight(t, tensors[f"{n}_scale"]) if t.dtype == FP8 else t
        for n, t in tensors.items()
        if not n.endswith("_scale")
    }


def load(moe: SparseMoE, tensors: dict[str, torch.Tensor]) -> SparseMoE:
    """Each expert's weight, then its scale (llama.py hands them over in this order)."""
    moe.gate.weight.data.copy_(tensors["gate.weight"])
    for e in range(E):
        for piece, (param, index) in {"gate": (moe.w13, 0), "up": (moe.w13, 1),
                                      "down": (moe.w2, 0)}.items():  # fmt: skip
            name = f"{e}.{piece}"
            param.weight_loader(param, tensors[name], (e, index))  # type: ignore[attr-defined]
            if name + "_scale" in tensors:
                scale = moe.w13_scale if param is moe.w13 else moe.w2_scale
                scale.weight_loader(scale, tensors[f"{name}_scale"], (e, index))  # type: ignore[attr-defined]
    moe.check_loaded()
    return moe


def make(inter: int, block: tuple[int, int] | None, tp: TPGroup | None = None) -> SparseMoE:
    """FP8 experts for checkpoint blocks `block` (None: per tensor or channel)."""
    moe = make_plain(inter, tp)
    moe.use_fp8(block)
    return moe


def make_plain(inter: int, tp: TPGroup | None = None) -> SparseMoE:
    """Experts in float32: the dequantized model."""
    return SparseMoE(H, inter, E, K, renormalize=True, tp=tp, dtype=torch.float32)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


@pytest.mark.parametrize(
    ("inter", "layout", "method_block", "blocks"),
    [
        (256, "128x128", (128, 128), ((128, 128), (128, 128))),
        (160, "128x128", (128, 128), ((1, 128), (128, 128))),  # up starts mid-block
        (160, "channel", None, ((1, H), (1, 160))),
        (160, "tensor", None, ((1, H), (1, 160))),
    ],
)
def test_an_fp8_checkpoint_loads_bit_for_bit_and_runs_as_the_dequantized_experts(
    inter: int,
    layout: str,
    method_block: tuple[int, int] | None,
    blocks: tuple[tuple[int, int], tuple[int, int]],
) -> None:
    tensors = checkpoint(inter, layout)
    moe = load(make(inter, method_block), tensors)
    reference = load(make_plain(inter), dequantized(tensors))
    assert moe.blocks == blocks
    assert moe.w13.dtype == FP8 and moe.w2.dtype == FP8
    assert torch.equal(bits(moe.w13[1, inter:]), bits(tensors["1.up"]))
    assert torch.equal(bits(moe.w2[3]), bits(tensors["3.down"]))
    scales = moe.scales()
    assert scales is not None
    assert torch.equal(dequantize(moe.w13, scales[0]), reference.w13)
    assert torch.equal(dequantize(moe.w2, scales[1]), reference.w2)
    x = torch.randn(29, H, generator=torch.Generator().manual_seed(1))
    assert torch.equal(moe(x), reference(x))  # the same float32 weights, the same matmuls


def ranks(inter: int, tensors: dict[str, torch.Tensor]) -> list[SparseMoE]:
    out = []
    for rank in range(2):
        tp = TPGroup(rank=rank, size=2, fast_all_reduce=lambda _: True)  # no collective
        out.append(load(make(inter, (128, 128), tp), tensors))
    return out


def test_ranks_off_the_checkpoints_blocks_hold_its_bits_in_finer_blocks() -> None:
    """Qwen3-30B-A3B-FP8 at 8 ranks in small: each rank's 96 of 192 intermediate rows.
    Gate/up rows keep their block's scale per row, down's columns blocks of 32 (96 and
    128 share 32): every rank holds the checkpoint's bits and scales, and the ranks'
    partial outputs add up to one rank's."""
    tensors = checkpoint(192, "128x128", seed=2)
    whole = load(make(192, (128, 128)), tensors)
    full = load(make_plain(192), dequantized(tensors))
    x = torch.randn(23, H, generator=torch.Generator().manual_seed(3))
    parts = []
    for rank, moe in enumerate(ranks(192, tensors)):
        assert moe.blocks == ((1, 128), (128, 32))
        scales = moe.scales()
        assert scales is not None
        assert torch.equal(bits(moe.w2[0]), bits(tensors["0.down"][:, rank * 96 : rank * 96 + 96]))
        cols = slice(rank * 96, rank * 96 + 96)
        rows = torch.cat([torch.arange(96) + rank * 96, torch.arange(96) + 192 + rank * 96])
        assert torch.equal(dequantize(moe.w2, scales[1]), full.w2[:, :, cols])
        assert torch.equal(dequantize(moe.w13, scales[0]), full.w13[:, rows])
        parts.append(moe(x))
    want = whole(x)
    torch.testing.assert_close(
        parts[0] + parts[1], want, atol=1e-6 * float(want.abs().max()), rtol=0
    )


def test_column_slices_too_narrow_for_a_k_step_are_quantized_again_per_row() -> None:
    """104 columns a rank: gcd(104, 128) = 8, under the kernel's smallest K step, so down
    is held per row. Rank 0's columns lie in the checkpoint's first group: its scale per
    row, the checkpoint's bits. Rank 1's straddle two groups: dequantized and quantized
    again per row, within e4m3's rounding of the checkpoint's values. gate/up keep the
    checkpoint's bits on both."""
    tensors = checkpoint(208, "128x128", seed=4)
    full = load(make_plain(208), dequantized(tensors))
    rank0, rank1 = ranks(208, tensors)
    for rank, moe in enumerate((rank0, rank1)):
        assert moe.blocks == ((1, 128), (1, 104))
        gate = tensors["2.gate"][rank * 104 : rank * 104 + 104]
        assert torch.equal(bits(moe.w13[2, :104]), bits(gate))
    assert torch.equal(bits(rank0.w2[1]), bits(tensors["1.down"][:, :104]))
    scales = rank1.scales()
    assert scales is not None
    want = full.w2[:, :, 104:]
    assert torch.equal(scales[1].scale[..., 0], want.abs().amax(dim=-1) / 448)
    err = (dequantize(rank1.w2, scales[1]) - want).abs()
    assert bool((err <= 2**-4 * want.abs() + 2**-10 * scales[1].scale).all())
    assert bool((err > 0).any())  # rounded again, not the checkpoint's values


def test_full_precision_experts_are_quantized_at_load_per_row() -> None:
    """amax of the checkpoint row / 448, the whole row's under tensor parallelism (as the
    dense FP8 layers); each value within e4m3's rounding: half a step, 2^-4 of the value
    (3 mantissa bits) or 2^-10 of the scale among subnormals."""
    tensors = dequantized(checkpoint(64, "tensor", seed=5))
    tensors = {n: t + 0.01 * torch.randn(t.shape) for n, t in tensors.items()}  # off e4m3
    for rank in range(2):
        tp = TPGroup(rank=rank, size=2, fast_all_reduce=lambda _: True)
        moe = load(make(64, None, tp), tensors)
        assert moe.blocks == ((1, H), (1, 32))
        scales = moe.scales()
        assert scales is not None
        cols = slice(rank * 32, rank * 32 + 32)
        down = torch.stack([tensors[f"{e}.down"] for e in range(E)])
        assert torch.equal(scales[1].scale[..., 0], down.abs().amax(dim=-1) / 448)
        err = (dequantize(moe.w2, scales[1]) - down[:, :, cols]).abs()
        assert bool((err <= 2**-4 * down[:, :, cols].abs() + 2**-10 * scales[1].scale).all())
        assert bool((err > 0).any())  # quantized, not copied


def test_dequantized_experts_are_the_cpu_workers() -> None:
    tensors = checkpoint(160, "128x128", seed=6)
    moe = load(make(160, (128, 128)), tensors)
    reference = load(make_plain(160), dequantized(tensors))
    x = torch.randn(11, H, generator=torch.Generator().manual_seed(7))
    want = moe(x)
    assert dequantize_linears(moe, torch.float32) == 1
    assert not moe.fp8 and moe.w13.dtype == torch.float32 and not hasattr(moe, "w13_scale")
    assert torch.equal(moe.w13, reference.w13) and torch.equal(moe(x), want)


def test_scales_that_fit_nothing_and_missing_scales_are_value_errors() -> None:
    tensors = checkpoint(160, "128x128")
    moe = make(160, (128, 128))
    moe.w2.weight_loader(moe.w2, tensors["0.down"], (0, 0))  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=re.escape("scales (3, 3) fit no layout")):
        moe.w2_scale.weight_loader(moe.w2_scale, torch.ones(3, 3), (0, 0))  # type: ignore[attr-defined]
    # per-channel scales differ within a 128-row block of down's rows
    with pytest.raises(ValueError, match=re.escape(f"scales ({H},) do not fit this rank's")):
        moe.w2_scale.weight_loader(moe.w2_scale, torch.arange(1.0, H + 1), (0, 0))  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="without its weight_scale"):
        moe.check_loaded()
    unquantized = make_plain(160)
    with pytest.raises(
        ValueError, match=re.escape("an FP8 expert weight for experts held in torch.float32")
    ):
        unquantized.w2.weight_loader(unquantized.w2, tensors["0.down"], (0, 0))  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=re.escape("must be float8_e4m3fn, got torch.float8_e5m2")):
        moe.w2.weight_loader(moe.w2, tensors["0.down"].to(torch.float8_e5m2), (0, 0))  # type: ignore[attr-defined]
    # block scales into per-row experts are quantized again: only after their values
    per_row = make(160, None)
    with pytest.raises(ValueError, match="quantize again per row came before their weight"):
        per_row.w2_scale.weight_loader(per_row.w2_scale, tensors["0.down_scale"], (0, 0))  # type: ignore[attr-defined]


def test_a_models_bad_expert_scale_is_named() -> None:
    """Through the model's loader: the error names the checkpoint tensor."""
    arch = LlamaArchConfig(
        vocab_size=64, hidden_size=H, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_experts=E,
        num_experts_per_tok=K, moe_intermediate_size=160, architecture="Qwen3MoeForCausalLM",
    )  # fmt: skip
    model = LlamaForCausalLM(arch, quantization="fp8-128x128")
    tensors = checkpoint(160, "128x128")
    name = "model.layers.0.mlp.experts.0.down_proj.weight"
    weights = [(name, tensors["0.down"]), (f"{name}_scale", torch.ones(2, 5))]
    with pytest.raises(ValueError, match=re.escape(f"weight '{name}_scale': scales (2, 5) fit")):
        model.load_weights(weights)

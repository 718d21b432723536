"""A sparse MLP (mixture of experts, Mixtral and Qwen3-MoE): a router scores every expert
for each token, the token goes to its `top_k` best, and its output is their outputs
weighted by the router's softmax probabilities (rescaled to sum to one with
`renormalize`). Each expert is a SiLU MLP like the dense one.

The experts' weights are stacked, one tensor per projection: `w13` [E, 2 * I, H] (each
expert's gate rows, then its up rows) and `w2` [E, H, I]. Tensor parallelism splits every
expert's intermediate size I across the ranks as the dense MLP splits its own (gate/up by
rows, down by columns), so each rank computes a partial sum of every token's output and
one all-reduce adds them; the router is replicated.

On CUDA (where `kernels.enabled`) the experts run as two grouped GEMMs in Triton
(layers/kernels/fused_moe.py): the pairs sorted by expert on the device, no host sync.
Elsewhere, and as that kernel's reference, the forward groups the (token, expert) pairs by
expert and runs one gate/up and one down matmul per expert that has tokens, reading the
per-expert counts back to the host once a layer (which a CUDA graph could not hold; the
grouped GEMMs can, and a sparse model's decode steps replay graphs). The outputs are
accumulated in float32 and rounded to the model's dtype once.

FP8 experts (`use_fp8`, which `quantize_experts` calls on a model quantized to FP8, as
its linear layers are): `w13` and `w2` hold e4m3 values, `w13_scale` and `w2_scale`
float32 block scales [E, ceil(N / bn), ceil(K / bk)] (layers/quantization/fp8_experts.py
says which blocks). The grouped GEMMs run them weight-only for decode-sized steps and
with FP8 activations, quantized inside `fused_experts`, for larger ones (its module
says which and why). An FP8 checkpoint's values load bit
for bit, a full-precision checkpoint is quantized at load, each checkpoint tensor whole
before this rank's rows or columns are taken, as the dense FP8 layers do. The PyTorch path
dequantizes each expert it runs (e4m3 times its scales in float32, then the model dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixmesh.worker.layers import kernels
from radixmesh.worker.layers.activation import SiluAndMul
from radixmesh.worker.layers.parallel import SINGLE, TPGroup
from radixmesh.worker.layers.quantization.fp8_experts import (
    Block,
    BlockScales,
    block_scales,
    dequantize,
    element_scales,
    held_blocks,
    quantize_checkpoint,
    requantize_rows,
)
from radixmesh.worker.layers.quantization.fp8_scales import FP8, checkpoint_scales
from radixmesh.worker.layers.weights import (
    Loaded,
    ShardId,
    as_tensor,
    copy_checked,
    mark_optional,
    new_parameter,
    set_weight_loader,
)

Device = torch.device | str | None


class SparseMoE(nn.Module):
    # FP8 experts' block scales, made by `use_fp8`.
    w13_scale: nn.Parameter
    w2_scale: nn.Parameter

    def __init__(
        self,
        hidden_size: int,
        expert_size: int,
        num_experts: int,
        top_k: int,
        *,
        renormalize: bool,
        tp: TPGroup | None = None,
        dtype: torch.dtype | None = None,
        device: Device = None,
        shared_expert: nn.Module | None = None,
    ) -> None:
        """`shared_expert` (Qwen2-MoE): a dense MLP every token also takes, its output
        (summed over the ranks by its own row-parallel layer) scaled by
        sigmoid(shared_expert_gate(x)) and added."""
        super().__init__()
        self.tp = tp or SINGLE
        self.num_experts = num_experts
        self.top_k = top_k
        self.renormalize = renormalize
        self.hidden_size = hidden_size
        self.expert_size = expert_size
        self.local_size = self.tp.divide(expert_size, "moe_intermediate_size")
        self.gate = _Router(num_experts, hidden_size, dtype=dtype, device=device)
        i = self.local_size
        self.w13 = new_parameter(num_experts, 2 * i, hidden_size, dtype=dtype, device=device)
        self.w2 = new_parameter(num_experts, hidden_size, i, dtype=dtype, device=device)
        set_weight_loader(self.w13, self._load_w13)
        set_weight_loader(self.w2, self._load_w2)
        # FP8 experts (`use_fp8`): the blocks of each weight's scales; None: model dtype.
        self.checkpoint_block: Block | None = None
        self.blocks: tuple[Block, Block] | None = None
        self.act_fn = SiluAndMul()
        self.shared_expert = shared_expert
        if shared_expert is not None:
            self.shared_expert_gate = _Router(1, hidden_size, dtype=dtype, device=device)

    def wants_fp8_input(self, x: torch.Tensor) -> bool:
        """Never: the norm hands the experts its output in the model's dtype; FP8 experts
        quantize it themselves where a step takes FP8 activations (fused_moe.py), with
        scales in their weights' blocks."""
        return False

    # ---- weights ----------------------------------------------------------------------

    def use_fp8(self, checkpoint_block: Block | None) -> None:
        """Hold the experts in FP8, before the weights load: `checkpoint_block` is the
        scale blocks of the checkpoint's FP8 weights, and of a full-precision weight
        quantized at load (fp8_experts.checkpoint_block; None: per tensor or channel)."""
        e, h, i = self.num_experts, self.hidden_size, self.local_size
        device = self.w13.device
        self.checkpoint_block = checkpoint_block
        self.blocks = held_blocks(checkpoint_block, h, i, self.tp.size)
        for name, (n, k), block in zip(("w13", "w2"), ((2 * i, h), (h, i)), self.blocks,
                                       strict=True):  # fmt: skip
            # Values and scales NaN until loaded: a requantized slice whose values never
            # came, and an expert whose scale never came, are found.
            weight = _nan_parameter((e, n, k), FP8, device)
            set_weight_loader(weight, self._load_w13 if name == "w13" else self._load_w2)
            setattr(self, name, weight)
            scale = _nan_parameter((e, -(-n // block[0]), -(-k // block[1])), torch.float32, device)
            set_weight_loader(scale, self._load_scale)
            mark_optional(scale)  # computed at load from a full-precision weight
            setattr(self, f"{name}_scale", scale)

    @property
    def fp8(self) -> bool:
        return self.blocks is not None

    def scales(self) -> tuple[BlockScales, BlockScales] | None:
        """FP8 experts' (w13's, w2's) scales; None for experts in the model's dtype."""
        if self.blocks is None:
            return None
        w13_block, w2_block = self.blocks
        return BlockScales(self.w13_scale, w13_block), BlockScales(self.w2_scale, w2_block)

    def check_loaded(self) -> None:
        if self.fp8 and (torch.isnan(self.w13_scale).any() or torch.isnan(self.w2_scale).any()):
            raise ValueError("an FP8 expert weight came without its weight_scale")

    def dequantize_(self, dtype: torch.dtype) -> None:
        """Hold FP8 experts as their dequantized values in `dtype` (the CPU worker: no FP8
        GEMM, and dequantizing every expert at every step would cost more than the step)."""
        scales = self.scales()
        if scales is None:
            return
        for name, scale in zip(("w13", "w2"), scales, strict=True):
            weight = nn.Parameter(
                dequantize(getattr(self, name), scale).to(dtype), requires_grad=False
            )
            setattr(self, name, weight)
            delattr(self, f"{name}_scale")
        self.blocks = self.checkpoint_block = None

    def _expert_of(self, shard_id: ShardId) -> tuple[int, int]:
        if not (isinstance(shard_id, tuple) and 0 <= shard_id[0] < self.num_experts):
            raise ValueError(f"expected an (expert, piece) shard, got {shard_id!r}")
        return shard_id

    def _part(self, w13: bool, piece: int) -> tuple[tuple[int, int], tuple[int, int], slice]:
        """This rank's part of an expert's checkpoint tensor, (rows, columns) as (start,
        length) pairs, and the rows of w13 / w2 it fills."""
        i, h, rank = self.local_size, self.hidden_size, self.tp.rank
        if w13:  # gate (piece 0) or up (piece 1), [I, H]: this rank's rows
            return (rank * i, i), (0, h), slice(piece * i, (piece + 1) * i)
        return (0, h), (rank * i, i), slice(None)  # down, [H, I]: this rank's columns

    def _load_w13(self, param: nn.Parameter, loaded: Loaded, shard_id: ShardId) -> None:
        """An expert's gate (piece 0) or up (piece 1) projection, [I, H]: this rank's rows."""
        self._load_weight(param, loaded, shard_id, w13=True)

    def _load_w2(self, param: nn.Parameter, loaded: Loaded, shard_id: ShardId) -> None:
        """An expert's down projection, [H, I]: this rank's columns."""
        self._load_weight(param, loaded, shard_id, w13=False)

    def _load_weight(self, param: nn.Parameter, loaded: Loaded, shard_id: ShardId, *,
                     w13: bool) -> None:  # fmt: skip
        """Full precision into model-dtype experts; FP8 values as they are into FP8 experts
        (their scale loads after them: llama.py pairs the two), a full-precision weight
        quantized whole first, its scales loaded here."""
        expert, piece = self._expert_of(shard_id)
        full = (self.expert_size, self.hidden_size) if w13 else (self.hidden_size, self.expert_size)
        if tuple(loaded.shape) != full:
            raise ValueError(f"shape mismatch: expected {full}, got {tuple(loaded.shape)}")
        fp8 = loaded.dtype == FP8
        if loaded.dtype.is_floating_point and loaded.dtype.itemsize == 1 and not fp8:
            raise ValueError(f"FP8 weights must be float8_e4m3fn, got {loaded.dtype}")
        if fp8 and not self.fp8:
            raise ValueError(
                f"an FP8 expert weight for experts held in {param.dtype}: the model must be "
                "quantized (an FP8 checkpoint's quantization_config names the method)"
            )
        if self.fp8 and not fp8:
            q, scale = quantize_checkpoint(as_tensor(loaded), self.checkpoint_block)
            self._load_weight(param, q, shard_id, w13=w13)
            self._load_scale(self.w13_scale if w13 else self.w2_scale, scale, shard_id)
            return
        (r0, n), (c0, m), dest = self._part(w13, piece)
        part = loaded.narrow(0, r0, n) if w13 else loaded.narrow(1, c0, m)
        copy_checked(param.data[expert, dest], part)

    def _load_scale(self, param: nn.Parameter, loaded: Loaded, shard_id: ShardId) -> None:
        """An FP8 expert weight's checkpoint scales (any layout `checkpoint_scales` reads)
        as this rank's blocks. Where the held blocks cannot carry them exactly and are per
        row, the rank's values (loaded before) are quantized again per row; otherwise that
        is a ValueError."""
        expert, piece = self._expert_of(shard_id)
        w13 = param is self.w13_scale
        assert self.blocks is not None
        block = self.blocks[0 if w13 else 1]
        full = (self.expert_size, self.hidden_size) if w13 else (self.hidden_size, self.expert_size)
        stored = as_tensor(loaded).to(device=param.device)
        scale = checkpoint_scales(stored, *full)  # [rows] or [rows, groups]
        rows, cols, dest = self._part(w13, piece)
        blocks = block_scales(scale, rows, cols, full[1], block)
        if blocks is None:
            if block != (1, cols[1]):
                raise ValueError(
                    f"scales {tuple(stored.shape)} do not fit this rank's blocks of {block} "
                    "(the checkpoint's layout differs from the quantization method's)"
                )
            values = (self.w13 if w13 else self.w2).data[expert, dest]
            if values.float().isnan().any():
                raise ValueError("scales to quantize again per row came before their weight")
            q, blocks = requantize_rows(values, element_scales(scale, rows, cols, full[1]))
            values.copy_(q)
        first = 0 if dest.start is None else dest.start // block[0]
        param.data[expert, first : first + blocks.shape[0]] = blocks

    # ---- forward ----------------------------------------------------------------------

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's experts [T, k] (int64) and their weights [T, k] (float32)."""
        logits = F.linear(x, self.gate.weight)  # [T, E]
        probs = torch.softmax(logits.float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: the normed rows [T, H] -> the sparse MLP's output [T, H] (summed over ranks)."""
        experts, weights = self.route(x)
        if kernels.enabled(x):
            from radixmesh.worker.layers.kernels.fused_moe import fused_experts

            out = fused_experts(x, self.w13, self.w2, experts, weights, scales=self.scales())
        else:
            out = self.forward_eager(x, experts, weights)
        out = self.tp.all_reduce(out)  # this rank's part of every expert's sum
        if self.shared_expert is None:
            return out
        scale = torch.sigmoid(F.linear(x, self.shared_expert_gate.weight))  # [T, 1]
        return out + scale * self.shared_expert(x)

    def expert_weights(self, expert: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """One expert's (w13 [2I, H], w2 [H, I]) in `dtype`: FP8 experts dequantized (e4m3
        times its scales in float32, rounded once)."""
        scales = self.scales()
        if scales is None:
            return self.w13[expert], self.w2[expert]
        w13, w2 = (
            dequantize(w[expert], BlockScales(s.scale[expert], s.block)).to(dtype)
            for w, s in zip((self.w13, self.w2), scales, strict=True)
        )
        return w13, w2

    def forward_eager(
        self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """The PyTorch path: one gate/up and one down matmul per expert with tokens; this
        rank's partial sums (`forward` adds them over the ranks)."""
        pairs = experts.flatten()  # (token, choice) pairs in token order
        order = torch.argsort(pairs, stable=True)  # grouped by expert
        counts = torch.bincount(pairs, minlength=self.num_experts).tolist()  # the one sync
        pair_weights = weights.flatten()
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        start = 0
        for expert, n in enumerate(counts):
            if n == 0:
                continue
            picked = order[start : start + n]
            start += n
            tokens = picked // self.top_k
            w13, w2 = self.expert_weights(expert, x.dtype)
            gate_up = F.linear(x[tokens], w13)  # [n, 2I]
            y = F.linear(self.act_fn(gate_up), w2)  # [n, H]
            out.index_add_(0, tokens, y.float() * pair_weights[picked, None])
        return out.to(x.dtype)


def _nan_parameter(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> nn.Parameter:
    return nn.Parameter(
        torch.full(shape, float("nan"), dtype=dtype, device=device), requires_grad=False
    )


class _Router(nn.Module):
    """A scoring weight [rows, H], the same on every rank: the router's (`gate.weight`, a
    row per expert) or the shared expert's gate (`shared_expert_gate.weight`, one row)."""

    def __init__(self, rows: int, hidden_size: int, *, dtype: torch.dtype | None,
                 device: Device) -> None:  # fmt: skip
        super().__init__()
        self.weight = new_parameter(rows, hidden_size, dtype=dtype, device=device)

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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixmesh.worker.layers import kernels
from radixmesh.worker.layers.activation import SiluAndMul
from radixmesh.worker.layers.parallel import SINGLE, TPGroup
from radixmesh.worker.layers.weights import (
    Loaded,
    ShardId,
    copy_checked,
    new_parameter,
    set_weight_loader,
)

Device = torch.device | str | None


class SparseMoE(nn.Module):
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
        self.expert_size = expert_size
        self.local_size = self.tp.divide(expert_size, "moe_intermediate_size")
        self.gate = _Router(num_experts, hidden_size, dtype=dtype, device=device)
        i = self.local_size
        self.w13 = new_parameter(num_experts, 2 * i, hidden_size, dtype=dtype, device=device)
        self.w2 = new_parameter(num_experts, hidden_size, i, dtype=dtype, device=device)
        set_weight_loader(self.w13, self._load_w13)
        set_weight_loader(self.w2, self._load_w2)
        self.act_fn = SiluAndMul()
        self.shared_expert = shared_expert
        if shared_expert is not None:
            self.shared_expert_gate = _Router(1, hidden_size, dtype=dtype, device=device)

    def wants_fp8_input(self, x: torch.Tensor) -> bool:
        """The experts keep the model's dtype: their input is never quantized."""
        return False

    # ---- weights ----------------------------------------------------------------------

    def _expert_of(self, shard_id: ShardId) -> tuple[int, int]:
        if not (isinstance(shard_id, tuple) and 0 <= shard_id[0] < self.num_experts):
            raise ValueError(f"expected an (expert, piece) shard, got {shard_id!r}")
        return shard_id

    def _load_w13(self, param: nn.Parameter, loaded: Loaded, shard_id: ShardId) -> None:
        """An expert's gate (piece 0) or up (piece 1) projection, [I, H]: this rank's rows."""
        expert, piece = self._expert_of(shard_id)
        i, h = self.local_size, param.shape[2]
        if tuple(loaded.shape) != (self.expert_size, h):
            raise ValueError(
                f"shape mismatch: expected {(self.expert_size, h)}, got {tuple(loaded.shape)}"
            )
        rows = loaded.narrow(0, self.tp.rank * i, i)
        copy_checked(param.data[expert, piece * i : (piece + 1) * i], rows)

    def _load_w2(self, param: nn.Parameter, loaded: Loaded, shard_id: ShardId) -> None:
        """An expert's down projection, [H, I]: this rank's columns."""
        expert, _ = self._expert_of(shard_id)
        i, h = self.local_size, param.shape[1]
        if tuple(loaded.shape) != (h, self.expert_size):
            raise ValueError(
                f"shape mismatch: expected {(h, self.expert_size)}, got {tuple(loaded.shape)}"
            )
        copy_checked(param.data[expert], loaded.narrow(1, self.tp.rank * i, i))

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

            out = fused_experts(x, self.w13, self.w2, experts, weights)
        else:
            out = self.forward_eager(x, experts, weights)
        out = self.tp.all_reduce(out)  # this rank's part of every expert's sum
        if self.shared_expert is None:
            return out
        scale = torch.sigmoid(F.linear(x, self.shared_expert_gate.weight))  # [T, 1]
        return out + scale * self.shared_expert(x)

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
            gate_up = F.linear(x[tokens], self.w13[expert])  # [n, 2I]
            y = F.linear(self.act_fn(gate_up), self.w2[expert])  # [n, H]
            out.index_add_(0, tokens, y.float() * pair_weights[picked, None])
        return out.to(x.dtype)


class _Router(nn.Module):
    """A scoring weight [rows, H], the same on every rank: the router's (`gate.weight`, a
    row per expert) or the shared expert's gate (`shared_expert_gate.weight`, one row)."""

    def __init__(self, rows: int, hidden_size: int, *, dtype: torch.dtype | None,
                 device: Device) -> None:  # fmt: skip
        super().__init__()
        self.weight = new_parameter(rows, hidden_size, dtype=dtype, device=device)

"""The Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3), in Hugging Face's
names.

Reads like transformers' `modeling_llama.py`: embed -> N x (RMSNorm, attention with
rotary, residual, RMSNorm, SiLU MLP, residual) -> norm; Qwen3 norms each head's q and k
(RMSNorm over the head size, a weight for q and one for k) before rotary. Differences are
for speed only: q/k/v and gate/up are fused projections (one matmul each), cos/sin are
looked up once per step, attention goes through an `AttentionBackend` over the paged KV
pool, and each residual add is done by the norm that follows it (vLLM-style): a layer
takes and returns (hidden, residual), where hidden is the last sub-layer's output not yet
added in, and `RMSNorm(hidden, residual)` adds it into the residual stream in place and
normalizes the sum, one kernel on CUDA. The sums and the norms' inputs are the reference's. Tensor
parallelism lives in the layers; this file never sees a rank.

With FP8 weights, the ops that produce q/k/v's, gate/up's and down's inputs (the two
norms, SiLU-and-mul) ask the linear layer they feed whether it wants its input quantized
(`wants_fp8_input`: the `_scaled_mm` path, layers/quantization/fp8.py) and then quantize
it in their own kernel, bit for bit as the linear layer would have.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from radixmesh.worker.attention.base import AttentionBackend
from radixmesh.worker.forward_batch import ForwardBatch
from radixmesh.worker.layers.activation import SiluAndMul
from radixmesh.worker.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from radixmesh.worker.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from radixmesh.worker.layers.moe import SparseMoE
from radixmesh.worker.layers.norm import RMSNorm
from radixmesh.worker.layers.parallel import SINGLE, TPGroup
from radixmesh.worker.layers.quantization import quantize_experts, quantize_linears
from radixmesh.worker.layers.quantization.fp8_activation import Fp8Activation
from radixmesh.worker.layers.quantization.fp8_scales import FP8
from radixmesh.worker.layers.rotary import RotaryEmbedding, apply_rotary_, norm_rotary_
from radixmesh.worker.layers.weights import (
    Loaded,
    ShardId,
    as_tensor,
    get_weight_loader,
    is_optional,
)
from radixmesh.worker.model.arch import LlamaArchConfig

Device = torch.device | str | None


class LlamaAttention(nn.Module):
    def __init__(
        self, arch: LlamaArchConfig, layer_id: int, tp: TPGroup, dtype: torch.dtype, device: Device
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.head_dim = arch.head_size
        self.rotary = layer_id not in arch.nope_layers  # SmolLM3 skips it in some layers
        self.qkv_proj = QKVParallelLinear(
            arch.hidden_size,
            self.head_dim,
            arch.num_attention_heads,
            arch.num_key_value_heads,
            bias=arch.attention_bias,
            tp=tp,
            dtype=dtype,
            device=device,
        )
        self.num_heads = self.qkv_proj.num_heads  # on this rank
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(
            arch.num_attention_heads * self.head_dim,
            arch.hidden_size,
            tp=tp,
            dtype=dtype,
            device=device,
        )
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if arch.qk_norm:  # the same on every rank: it normalizes within a head
            eps = arch.rms_norm_eps
            self.q_norm = RMSNorm(self.head_dim, eps, dtype=dtype, device=device)
            self.k_norm = RMSNorm(self.head_dim, eps, dtype=dtype, device=device)

    def forward(
        self,
        hidden: torch.Tensor | Fp8Activation,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        attn: AttentionBackend,
    ) -> torch.Tensor:
        """hidden: the normed rows [T, hidden], or already quantized for qkv_proj."""
        t, h, hkv, d = hidden.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(hidden)  # [T, (Hq + 2 Hkv) * D]
        qk, v = qkv.split([(h + hkv) * d, hkv * d], dim=-1)
        # q and k sit side by side in the fused output: norm (Qwen3) and rotate both at
        # once (in place on CUDA: one kernel over the strided view).
        qk = qk.view(t, h + hkv, d)
        if self.q_norm is not None and self.k_norm is not None:
            qk = norm_rotary_(qk, h, self.q_norm, self.k_norm, *cos_sin, rotate=self.rotary)
        elif self.rotary:
            qk = apply_rotary_(qk, *cos_sin)  # [T, Hq + Hkv, D]
        q, k = qk.split([h, hkv], dim=1)  # [T, Hq, D], [T, Hkv, D]
        out = attn.forward(q, k, v.view(t, hkv, d), self.layer_id, batch)  # [T, Hq, D]
        # With FP8 weights o_proj quantizes this input with its own kernel: the attention
        # kernels do not write FP8.
        return self.o_proj(out.reshape(t, h * d))  # [T, hidden]


class LlamaMLP(nn.Module):
    def __init__(
        self,
        arch: LlamaArchConfig,
        tp: TPGroup,
        dtype: torch.dtype,
        device: Device,
        size: int | None = None,  # None: arch.intermediate_size
    ):
        super().__init__()
        size = size or arch.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(
            arch.hidden_size, [size, size], tp=tp, dtype=dtype, device=device
        )
        self.down_proj = RowParallelLinear(
            size, arch.hidden_size, tp=tp, dtype=dtype, device=device
        )
        self.act_fn = SiluAndMul()

    def wants_fp8_input(self, x: torch.Tensor) -> bool:
        return self.gate_up_proj.wants_fp8_input(x)

    def forward(self, x: torch.Tensor | Fp8Activation) -> torch.Tensor:
        """x: the normed rows [T, hidden], or already quantized for gate_up_proj."""
        gate_up = self.gate_up_proj(x)  # [T, 2 * intermediate]
        quantize = self.down_proj.wants_fp8_input(gate_up)
        return self.down_proj(self.act_fn(gate_up, quantize=quantize))  # [T, hidden]


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self, arch: LlamaArchConfig, layer_id: int, tp: TPGroup, dtype: torch.dtype, device: Device
    ) -> None:
        super().__init__()
        eps = arch.rms_norm_eps
        self.self_attn = LlamaAttention(arch, layer_id, tp, dtype, device)
        self.mlp: LlamaMLP | SparseMoE
        if arch.is_sparse_layer(layer_id):
            self.mlp = SparseMoE(
                arch.hidden_size,
                arch.expert_size,
                arch.num_experts,
                arch.num_experts_per_tok,
                renormalize=arch.norm_topk_prob,
                tp=tp,
                dtype=dtype,
                device=device,
                shared_expert=(
                    LlamaMLP(arch, tp, dtype, device, arch.shared_expert_intermediate_size)
                    if arch.shared_expert_intermediate_size
                    else None
                ),
            )
        else:
            self.mlp = LlamaMLP(arch, tp, dtype, device)
        self.residual_multiplier = arch.residual_multiplier
        self.input_layernorm = RMSNorm(arch.hidden_size, eps, dtype=dtype, device=device)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, eps, dtype=dtype, device=device)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        attn: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) -> (MLP output, residual stream before it), each [T, hidden].

        The first layer gets the embeddings and residual None; later layers get the
        previous layer's MLP output, which the input norm adds into the residual stream.
        """
        # The norms' outputs come quantized where their linear layer wants them so.
        quantize = self.self_attn.qkv_proj.wants_fp8_input(hidden)
        normed: torch.Tensor | Fp8Activation
        if residual is None:
            residual, normed = hidden, self.input_layernorm(hidden, quantize=quantize)
        else:
            normed, residual = self.input_layernorm(hidden, residual, quantize=quantize)
        hidden = self._scaled(self.self_attn(normed, cos_sin, batch, attn))
        quantize = self.mlp.wants_fp8_input(hidden)
        normed, residual = self.post_attention_layernorm(hidden, residual, quantize=quantize)
        return self._scaled(self.mlp(normed)), residual

    def _scaled(self, out: torch.Tensor) -> torch.Tensor:
        """A sub-layer's output as its residual add takes it (Granite scales it)."""
        return out * self.residual_multiplier if self.residual_multiplier != 1.0 else out


class LlamaModel(nn.Module):
    def __init__(
        self,
        arch: LlamaArchConfig,
        tp: TPGroup,
        dtype: torch.dtype,
        device: Device,
        quantization: str | None = None,
    ):
        """`quantization` (LlamaForCausalLM's): each decoder layer's linears and experts
        are handed to the method as soon as the layer is built, so the full-precision
        weights that construction allocates exist for one layer at a time, so a model that
        fits the device only quantized (Mixtral-8x7B in FP8 on one 80 GB card) is not
        refused by its own construction."""
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(
            arch.vocab_size, arch.hidden_size, tp=tp, dtype=dtype, device=device
        )
        layers = []
        for i in range(arch.num_hidden_layers):
            layer = LlamaDecoderLayer(arch, i, tp, dtype, device)
            if quantization is not None:
                quantize_linears(layer, quantization)
                quantize_experts(layer, quantization)
            layers.append(layer)
        self.num_kv_heads = layers[0].self_attn.num_kv_heads  # on this rank
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps, dtype=dtype, device=device)
        self.embedding_multiplier = arch.embedding_multiplier
        self.rotary_emb = RotaryEmbedding(
            arch.head_size,
            rope_theta=arch.rope_theta,
            max_position=arch.max_position_embeddings,
            rope_scaling=arch.rope_scaling,
            dtype=dtype,
            device=device,
        )

    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        hidden = self.embed_tokens(batch.input_ids)  # [T, hidden]
        if self.embedding_multiplier != 1.0:  # Granite
            hidden = hidden * self.embedding_multiplier
        cos_sin = self.rotary_emb(batch.positions)  # once per step, shared by every layer
        residual: torch.Tensor | None = None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, cos_sin, batch, attn)
        if residual is None:  # no layers
            return self.norm(hidden)
        return self.norm(hidden, residual)[0]  # [T, hidden]


# Checkpoint projections that live inside a fused parameter here: (checkpoint piece,
# our piece, shard id given to the fused parameter's weight_loader).
_FUSED: tuple[tuple[str, str, ShardId], ...] = (
    (".q_proj.", ".qkv_proj.", "q"),
    (".k_proj.", ".qkv_proj.", "k"),
    (".v_proj.", ".qkv_proj.", "v"),
    (".gate_proj.", ".gate_up_proj.", 0),
    (".up_proj.", ".gate_up_proj.", 1),
)
# Tensors some checkpoints carry that the model derives itself.
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")


class LlamaForCausalLM(nn.Module):
    def __init__(
        self,
        arch: LlamaArchConfig,
        *,
        tp: TPGroup | None = None,
        dtype: torch.dtype = torch.float32,
        device: Device = "cpu",
        quantization: str | None = None,
    ) -> None:
        """`quantization`: a method of layers/quantization/ for the decoder's linear
        layers (e.g. "fp8") and its experts (held in FP8); the embeddings,
        LM head, routers and norms keep `dtype`."""
        super().__init__()
        tp = tp or SINGLE
        self.arch = arch
        self.model = LlamaModel(arch, tp, dtype, device, quantization)
        self.lm_head = ParallelLMHead(
            arch.vocab_size, arch.hidden_size, tp=tp, dtype=dtype, device=device
        )
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.quantization = quantization  # applied layer by layer (LlamaModel)

    @property
    def num_kv_heads(self) -> int:
        """KV heads on this rank: what the KV pool of this rank must hold per layer."""
        return self.model.num_kv_heads

    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor:
        """Final-normed hidden states of every new token, [T, hidden]."""
        return self.model(batch, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] float32 of the rows of `hidden` [N, hidden] the caller needs."""
        logits = self.lm_head(hidden).float()
        scaling = self.arch.logits_scaling
        return logits / scaling if scaling != 1.0 else logits  # Granite

    def load_weights(self, weights: Iterable[tuple[str, Loaded]]) -> None:
        """Load full (unsharded) tensors under Hugging Face names; each parameter's
        weight_loader takes this rank's slice. Every parameter must be given exactly once."""
        params = dict(self.named_parameters())  # a tied lm_head.weight appears once
        arch = self.arch
        known = {name for ours in params for name in _checkpoint_names(ours, arch)}
        expected = {
            name
            for ours, p in params.items()
            if not is_optional(p)
            for name in _checkpoint_names(ours, arch)
        }
        loaded: set[str] = set()
        if arch.fused_checkpoint:
            weights = _unfused(weights, arch)
        if arch.num_experts:
            weights = _paired_expert_scales(weights)
        for name, tensor in weights:
            if _IGNORED.search(name) or (
                self.arch.tie_word_embeddings and name == "lm_head.weight"
            ):
                continue
            if name not in known:
                raise ValueError(f"unexpected weight {name!r}: the model has no such parameter")
            if name in loaded:
                raise ValueError(f"weight {name!r} given twice")
            target, shard_id = _to_ours(name, arch)
            param = params[target]
            try:
                get_weight_loader(param)(param, tensor, shard_id)
            except ValueError as e:
                raise ValueError(f"weight {name!r}: {e}") from None
            loaded.add(name)
        missing = sorted(expected - loaded)
        if missing:
            shown = ", ".join(missing[:8]) + (
                f" and {len(missing) - 8} more" if len(missing) > 8 else ""
            )
            raise ValueError(f"missing weights: {shown}")
        self._check_quantized_layers()

    def _check_quantized_layers(self) -> None:
        """A quantized layer's state the checkpoint left unfilled (an FP8 weight whose
        scale never came) is an error naming the layer."""
        for layer_name, layer in self.named_modules():
            method = getattr(layer, "linear_method", None)
            try:
                if method is not None:
                    method.check_loaded(layer)
                elif isinstance(layer, SparseMoE):
                    layer.check_loaded()
            except ValueError as e:
                raise ValueError(f"{layer_name}: {e}") from None


# A sparse layer's checkpoint tensors: `<layer>.<block>.experts.<e>.<projection>.weight`
# and the router's `<layer>.<block>.gate.weight` (block and projections: arch.expert_names).
_EXPERT = re.compile(r"^(?P<layer>.*\.)(?P<block>\w+)\.experts\.(?P<e>\d+)\.(?P<proj>\w+)\.weight$")
_ROUTER = re.compile(r"^(?P<layer>.*\.)(?P<block>\w+)\.gate\.weight$")


# An FP8 checkpoint's expert scales (`weight_scale_inv` arrives renamed `weight_scale`,
# model/hf.py) and activation scales.
_EXPERT_SCALE = re.compile(r"^(?P<weight>.*\.experts\.\d+\.\w+\.weight)_scale$")
_EXPERT_INPUT_SCALE = re.compile(r"\.experts\.\d+\.\w+\.input_scale$")


def _paired_expert_scales(
    weights: Iterable[tuple[str, Loaded]],
) -> Iterator[tuple[str, Loaded]]:
    """An FP8 checkpoint's expert weights (Qwen3-30B-A3B-FP8's, Mixtral FP8's), each
    followed at once by its scale, wherever the files put the two: the experts' scale
    loader may need the values already loaded (layers/moe.py: where a rank's slice falls
    on no whole scale block, its values are quantized again). A weight whose scale is
    there already goes on as it came (a lazy slice stays lazy); one that waits for its
    scale is read. Every other tensor as it comes; one left without its pair is a
    ValueError naming it. Expert activation scales are read past: FP8 experts quantize
    their inputs dynamically, where a step takes FP8 activations (fused_moe.py).

    Expert weights are never dequantized at load: a model is built quantized for
    an FP8 checkpoint (the worker takes the method from its quantization_config), and an
    unquantized one refuses FP8 expert weights as it refuses the dense layers' scales."""
    waiting: dict[str, torch.Tensor] = {}  # FP8 weights by name
    scales: dict[str, Loaded] = {}  # scales by their weight's name
    for name, tensor in weights:
        if _EXPERT_INPUT_SCALE.search(name):
            continue
        if m := _EXPERT_SCALE.match(name):
            weight = m["weight"]
            if weight in waiting:
                yield weight, waiting.pop(weight)
                yield name, tensor
            else:
                scales[weight] = as_tensor(tensor)
        elif tensor.dtype == FP8 and _EXPERT.match(name):
            if name in scales:
                yield name, tensor
                yield f"{name}_scale", scales.pop(name)
            else:
                waiting[name] = as_tensor(tensor)
        else:
            yield name, tensor
    if waiting or scales:
        alone = [f"{n} (no scale)" for n in sorted(waiting)]
        alone += [f"{n}_scale (no weight)" for n in sorted(scales)]
        raise ValueError(f"FP8 expert tensors without their pair: {', '.join(alone[:4])}")


def _unfused(
    weights: Iterable[tuple[str, Loaded]], arch: LlamaArchConfig
) -> Iterator[tuple[str, Loaded]]:
    """A fused checkpoint's `qkv_proj` and `gate_up_proj` tensors as their pieces under the
    separate names (rows q, k, v; gate, up), the other tensors as they come."""
    q_rows = arch.num_attention_heads * arch.head_size
    kv_rows = arch.num_key_value_heads * arch.head_size
    i = arch.intermediate_size
    for name, tensor in weights:
        if name.endswith(".qkv_proj.weight"):
            base = name.removesuffix("qkv_proj.weight")
            for piece, start, rows in (("q", 0, q_rows), ("k", q_rows, kv_rows),
                                       ("v", q_rows + kv_rows, kv_rows)):  # fmt: skip
                yield f"{base}{piece}_proj.weight", tensor.narrow(0, start, rows)
        elif name.endswith(".gate_up_proj.weight"):
            base = name.removesuffix("gate_up_proj.weight")
            yield f"{base}gate_proj.weight", tensor.narrow(0, 0, i)
            yield f"{base}up_proj.weight", tensor.narrow(0, i, i)
        else:
            yield name, tensor


def _to_ours(name: str, arch: LlamaArchConfig) -> tuple[str, ShardId]:
    """Checkpoint name -> (our parameter name, shard id within it)."""
    if arch.num_experts:
        if m := _EXPERT_SCALE.match(name):  # an FP8 expert's scale: beside its weight
            ours, shard_id = _to_ours(m["weight"], arch)
            return f"{ours}_scale", shard_id
        block, gate, up, down = arch.expert_names
        if (m := _EXPERT.match(name)) and m["block"] == block:
            pieces = {gate: ("w13", 0), up: ("w13", 1), down: ("w2", 0)}
            if (piece := pieces.get(m["proj"])) is not None:
                return f"{m['layer']}mlp.{piece[0]}", (int(m["e"]), piece[1])
        if (m := _ROUTER.match(name)) and m["block"] == block:
            return f"{m['layer']}mlp.gate.weight", None
    for theirs, ours, shard_id in _FUSED:
        if theirs in name:
            return name.replace(theirs, ours), shard_id
    return name, None


def _checkpoint_names(param_name: str, arch: LlamaArchConfig) -> list[str]:
    """Our parameter name -> the checkpoint names that fill it."""
    if arch.num_experts:
        block, gate, up, down = arch.expert_names
        layer, _, ours = param_name.rpartition("mlp.")
        experts = range(arch.num_experts)
        ours, scale = ours.removesuffix("_scale"), "_scale" if ours.endswith("_scale") else ""
        if ours == "w13":
            pieces = (gate, up)
            return [
                f"{layer}{block}.experts.{e}.{p}.weight{scale}" for e in experts for p in pieces
            ]
        if ours == "w2":
            return [f"{layer}{block}.experts.{e}.{down}.weight{scale}" for e in experts]
        if ours == "gate.weight":
            return [f"{layer}{block}.gate.weight"]
    names = [param_name.replace(ours, theirs) for theirs, ours, _ in _FUSED if ours in param_name]
    return names or [param_name]

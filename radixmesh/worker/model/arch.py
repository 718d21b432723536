"""Architecture hyperparameters of a Llama-family model, under Hugging Face's names.

One dataclass covers Llama 2/3, SmolLM2, Mistral, Qwen2 (qkv bias), Qwen3 (an RMSNorm
over each head's q and k before rotary; a head size that need not be hidden / heads), and
the mixture-of-experts members Mixtral, Qwen2-MoE (with a shared expert) and Qwen3-MoE
(`num_experts` > 0: a sparse MLP in place of the dense one, layers/moe.py). Phi-3 and
Phi-4 are Llama-shaped too; their checkpoints fuse q/k/v and gate/up (`fused_checkpoint`);
so is Granite, with four scalings (`embedding_multiplier` and the three after it), and
SmolLM3, whose `nope_layers` attend without rotary.
Loaders produce it from config.json or GGUF metadata; `dummy:<preset>` uses the presets
below.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

_ARCH_OF_MODEL_TYPE = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
}
_MODEL_TYPE_OF_ARCH = {arch: model_type for model_type, arch in _ARCH_OF_MODEL_TYPE.items()}


@dataclass(frozen=True)
class LlamaArchConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # e.g. {"rope_type": "llama3", ...}
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q/k/v projections
    qk_norm: bool = False  # Qwen3: RMSNorm (over head_size) of each head's q and k
    # Mixture of experts (0: a dense model): each sparse layer's router picks a token's
    # `num_experts_per_tok` experts, each a SiLU MLP of `moe_intermediate_size` (None:
    # intermediate_size, as Mixtral's); `norm_topk_prob` rescales the picked probabilities
    # to sum to one. Layer i is sparse unless listed in `mlp_only_layers`, and when
    # (i + 1) is a multiple of `decoder_sparse_step` (Qwen3-MoE's names).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # Qwen2-MoE: a dense SiLU MLP of this size beside the experts of every sparse layer,
    # its output scaled by sigmoid(shared_expert_gate(x)) (0: none).
    shared_expert_intermediate_size: int = 0
    # Attention over the last `sliding_window` positions only (Mistral 7B v0.1's 4,096;
    # Qwen's configs name one but apply it only with use_sliding_window). Not implemented:
    # the context is capped at the window instead (`context_limit`), where the two agree.
    sliding_window: int | None = None
    # Granite's scalings: the embeddings times `embedding_multiplier`, each sub-layer's
    # output times `residual_multiplier` before its residual add, attention scores times
    # `attention_multiplier` (None: 1 / sqrt(head_size)), the logits divided by
    # `logits_scaling`.
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None
    logits_scaling: float = 1.0
    # SmolLM3: the layers whose attention skips rotary (no position encoding at all).
    nope_layers: tuple[int, ...] = ()
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    architecture: str = "LlamaForCausalLM"
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads: {self.num_key_value_heads} does not divide "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok: must be in [1, num_experts ({self.num_experts})], "
                f"got {self.num_experts_per_tok}"
            )
        if self.decoder_sparse_step < 1:
            raise ValueError(f"decoder_sparse_step: must be >= 1, got {self.decoder_sparse_step}")

    def is_sparse_layer(self, layer_id: int) -> bool:
        """Whether decoder layer `layer_id` has experts in place of the dense MLP."""
        return (
            self.num_experts > 0
            and layer_id not in self.mlp_only_layers
            and (layer_id + 1) % self.decoder_sparse_step == 0
        )

    @property
    def attention_scale(self) -> float:
        """What the attention multiplies q . k by."""
        if self.attention_multiplier is not None:
            return self.attention_multiplier
        return float(self.head_size**-0.5)

    @property
    def fused_checkpoint(self) -> bool:
        """Whether the checkpoint stores q/k/v as one `qkv_proj` and gate/up as one
        `gate_up_proj` (Phi-3), split into their pieces at load."""
        return self.architecture == "Phi3ForCausalLM"

    @property
    def longest_context(self) -> int:
        """The longest context `context_length` may ask for: the model's own, or what its
        rope scaling stretches its original context to (linear, YaRN: Qwen's configs keep
        max_position_embeddings at the unscaled length), capped at a sliding window."""
        longest = self.max_position_embeddings
        scaling = self.rope_scaling or {}
        kind = scaling.get("rope_type", scaling.get("type"))
        old, factor = scaling.get("original_max_position_embeddings"), scaling.get("factor")
        if kind in ("linear", "yarn") and old and factor:
            longest = max(longest, int(old * factor))
        return min(longest, self.sliding_window) if self.sliding_window else longest

    @property
    def context_limit(self) -> int:
        """The longest context served: the model's, capped at its sliding window."""
        limit = self.max_position_embeddings
        return min(limit, self.sliding_window) if self.sliding_window else limit

    @property
    def expert_size(self) -> int:
        """The intermediate size of one expert."""
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def expert_names(self) -> tuple[str, str, str, str]:
        """Checkpoint names of a sparse layer's block and an expert's gate, up and down
        projections: Mixtral's `block_sparse_moe.experts.N.w1/w3/w2`, else Qwen's
        `mlp.experts.N.gate_proj/up_proj/down_proj`."""
        if self.architecture == "MixtralForCausalLM":
            return ("block_sparse_moe", "w1", "w3", "w2")
        return ("mlp", "gate_proj", "up_proj", "down_proj")

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def num_params(self) -> int:
        h, i = self.hidden_size, self.intermediate_size
        v, n = self.vocab_size, self.num_hidden_layers
        d = self.head_size
        attn = h * d * (self.num_attention_heads * 2 + self.num_key_value_heads * 2)
        per_layer = attn + 2 * h + (2 * d if self.qk_norm else 0)
        sparse = sum(self.is_sparse_layer(layer) for layer in range(n))
        mlps = (n - sparse) * 3 * h * i
        mlps += sparse * self.num_experts * (3 * h * self.expert_size + h)  # experts, router
        mlps += sparse * (3 * h * self.shared_expert_intermediate_size + h)  # shared expert
        emb = v * h * (1 if self.tie_word_embeddings else 2)
        return n * per_layer + mlps + emb + h

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> LlamaArchConfig:
        """From a Hugging Face config.json dict (Llama, Mistral, Qwen2, Qwen3, Mixtral,
        Qwen3-MoE)."""
        # Configs built in code (not read from a checkpoint) carry no "architectures".
        default_arch = _ARCH_OF_MODEL_TYPE.get(cfg.get("model_type", ""), "LlamaForCausalLM")
        arch = (cfg.get("architectures") or [default_arch])[0]
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        rope_scaling = cfg.get("rope_scaling")
        rope_theta = cfg.get("rope_theta")
        # transformers >= 5 nests rope settings under rope_parameters.
        rope_params = cfg.get("rope_parameters")
        if isinstance(rope_params, dict):
            rope_theta = rope_theta or rope_params.get("rope_theta")
            if rope_params.get("rope_type", "default") != "default" and rope_scaling is None:
                rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            head_dim=cfg.get("head_dim"),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(rope_theta or 10000.0),
            rope_scaling=rope_scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", arch.startswith("Qwen2"))),
            qk_norm=arch.startswith("Qwen3"),
            # Qwen3-MoE says num_experts (transformers >= 5 also num_local_experts), Mixtral
            # num_local_experts; Mixtral always rescales the picked probabilities.
            num_experts=int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0),
            num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0),
            moe_intermediate_size=cfg.get("moe_intermediate_size"),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", arch == "MixtralForCausalLM")),
            decoder_sparse_step=int(cfg.get("decoder_sparse_step") or 1),
            mlp_only_layers=tuple(cfg.get("mlp_only_layers") or ()),
            shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0),
            sliding_window=(
                None if cfg.get("use_sliding_window") is False else cfg.get("sliding_window")
            ),
            embedding_multiplier=float(cfg.get("embedding_multiplier", 1.0)),
            residual_multiplier=float(cfg.get("residual_multiplier", 1.0)),
            attention_multiplier=cfg.get("attention_multiplier"),
            logits_scaling=float(cfg.get("logits_scaling", 1.0)),
            # SmolLM3's no_rope_layers: a flag per layer, 0 where rotary is skipped.
            nope_layers=tuple(
                i for i, use in enumerate(cfg.get("no_rope_layers") or ()) if not use
            ),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            architecture=arch,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json dict transformers can load (for references and the weight cache)."""
        model_type = _MODEL_TYPE_OF_ARCH.get(self.architecture, "llama")
        out: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "sliding_window": self.sliding_window,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids)
            if len(self.eos_token_ids) != 1
            else self.eos_token_ids[0],
        }
        if model_type in ("llama", "qwen3", "qwen3_moe"):
            out["attention_bias"] = self.attention_bias
        if model_type == "granite":
            out["embedding_multiplier"] = self.embedding_multiplier
            out["residual_multiplier"] = self.residual_multiplier
            out["attention_multiplier"] = self.attention_scale
            out["logits_scaling"] = self.logits_scaling
        if model_type == "smollm3":
            n = self.num_hidden_layers
            out["no_rope_layers"] = [int(i not in self.nope_layers) for i in range(n)]
        if model_type == "mixtral":
            out["num_local_experts"] = self.num_experts
            out["num_experts_per_tok"] = self.num_experts_per_tok
        elif self.num_experts:
            out["num_experts"] = self.num_experts
            out["num_experts_per_tok"] = self.num_experts_per_tok
            out["moe_intermediate_size"] = self.expert_size
            out["norm_topk_prob"] = self.norm_topk_prob
            out["decoder_sparse_step"] = self.decoder_sparse_step
            out["mlp_only_layers"] = list(self.mlp_only_layers)
            if self.shared_expert_intermediate_size:
                out["shared_expert_intermediate_size"] = self.shared_expert_intermediate_size
        if model_type == "llama":
            out["mlp_bias"] = False
        return out

    def replace(self, **changes: Any) -> LlamaArchConfig:
        return dataclasses.replace(self, **changes)


def _llama3_scaling(factor: float = 8.0) -> dict[str, Any]:
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


# Real shapes for `dummy:<preset>` (random weights, for benchmarks where no weights can be
# downloaded). `tiny` is for tests: every code path, a few milliseconds a step.
PRESETS: dict[str, LlamaArchConfig] = {
    "tiny": LlamaArchConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_ids=(2,),
        bos_token_id=1,
    ),
    "smollm2-135m": LlamaArchConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        eos_token_ids=(2,),
        bos_token_id=1,
    ),
    "llama-2-7b": LlamaArchConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
        eos_token_ids=(2,),
        bos_token_id=1,
    ),
    "llama-3-8b": LlamaArchConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        eos_token_ids=(128001, 128009),
        bos_token_id=128000,
    ),
    "llama-3.1-8b": LlamaArchConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        rope_scaling=_llama3_scaling(),
        max_position_embeddings=131072,
        eos_token_ids=(128001, 128008, 128009),
        bos_token_id=128000,
    ),
    "llama-3.2-1b": LlamaArchConfig(  # Llama-3's tokenizer: a draft model for the 8B
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        rope_scaling=_llama3_scaling(32.0),
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        eos_token_ids=(128001, 128008, 128009),
        bos_token_id=128000,
    ),
    "llama-3-70b": LlamaArchConfig(
        vocab_size=128256,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        eos_token_ids=(128001, 128009),
        bos_token_id=128000,
    ),
    "mistral-7b": LlamaArchConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        eos_token_ids=(2,),
        bos_token_id=1,
        architecture="MistralForCausalLM",
    ),
    "qwen2-7b": LlamaArchConfig(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        attention_bias=True,
        eos_token_ids=(151643, 151645),
        architecture="Qwen2ForCausalLM",
    ),
    "qwen3-8b": LlamaArchConfig(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        qk_norm=True,
        eos_token_ids=(151645,),
        bos_token_id=151643,
        architecture="Qwen3ForCausalLM",
    ),
    "phi-4": LlamaArchConfig(
        vocab_size=100352,
        hidden_size=5120,
        intermediate_size=17920,
        num_hidden_layers=40,
        num_attention_heads=40,
        num_key_value_heads=10,
        rope_theta=250000.0,
        max_position_embeddings=16384,
        eos_token_ids=(100265,),
        bos_token_id=100257,
        architecture="Phi3ForCausalLM",
    ),
    "qwen1.5-moe-a2.7b": LlamaArchConfig(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=16,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=8192,
        attention_bias=True,
        num_experts=60,
        num_experts_per_tok=4,
        moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632,
        eos_token_ids=(151643,),
        architecture="Qwen2MoeForCausalLM",
    ),
    "qwen3-30b-a3b": LlamaArchConfig(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=40960,
        qk_norm=True,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
        eos_token_ids=(151645,),
        bos_token_id=151643,
        architecture="Qwen3MoeForCausalLM",
    ),
    "mixtral-8x7b": LlamaArchConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        eos_token_ids=(2,),
        bos_token_id=1,
        architecture="MixtralForCausalLM",
    ),
    # A miniature Qwen3-MoE for tests: every sparse-layer path in a few milliseconds.
    "tiny-moe": LlamaArchConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        qk_norm=True,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        eos_token_ids=(2,),
        bos_token_id=1,
        architecture="Qwen3MoeForCausalLM",
    ),
}

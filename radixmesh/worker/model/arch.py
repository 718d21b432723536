"""Architecture hyperparameters of a Llama-family model, under Hugging Face's names.

One dataclass covers Llama 2/3, SmolLM2, Mistral, Qwen2 (qkv bias) and Qwen3 (an RMSNorm
over each head's q and k before rotary; a head size that need not be hidden / heads).
Loaders produce it from config.json or GGUF metadata; `dummy:<preset>` uses the presets
below.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

_ARCH_OF_MODEL_TYPE = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
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

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def num_params(self) -> int:
        h, i = self.hidden_size, self.intermediate_size
        v, n = self.vocab_size, self.num_hidden_layers
        d = self.head_size
        attn = h * d * (self.num_attention_heads * 2 + self.num_key_value_heads * 2)
        per_layer = attn + 3 * h * i + 2 * h + (2 * d if self.qk_norm else 0)
        emb = v * h * (1 if self.tie_word_embeddings else 2)
        return n * per_layer + emb + h

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> LlamaArchConfig:
        """From a Hugging Face config.json dict (Llama, Mistral, Qwen2, Qwen3)."""
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
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids)
            if len(self.eos_token_ids) != 1
            else self.eos_token_ids[0],
        }
        if model_type in ("llama", "qwen3"):
            out["attention_bias"] = self.attention_bias
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
}

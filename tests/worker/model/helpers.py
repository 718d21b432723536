"""Drive a model through ragged forward steps without the scheduler (for model tests).

`RaggedRunner` owns a KV pool, a req->token table and a shuffled free list of slots (so
every sequence's KV is scattered over non-contiguous slots, as after evictions).
`step([(row, new_token_ids), ...])` runs one mixed batch — prompt chunks and decode
tokens of several sequences together — and returns each item's logits.

`make_pair(variant)` builds a small random transformers model and ours with its weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers

from radixmesh.worker.attention.registry import create_attention_backend
from radixmesh.worker.forward_batch import ForwardBatch
from radixmesh.worker.kvcache.pool import KVPool
from radixmesh.worker.model.arch import LlamaArchConfig
from radixmesh.worker.model.llama import LlamaForCausalLM


class RaggedRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        *,
        num_slots: int = 2048,
        max_requests: int = 8,
        max_context: int = 512,
        seed: int = 0,
        backend: str = "torch",
        kv_dtype: torch.dtype | None = None,  # None: the model's (its embedding's) dtype
    ) -> None:
        arch = model.arch
        param = next(model.parameters())
        self.model = model
        self.pool = KVPool(
            num_slots=num_slots,
            num_layers=arch.num_hidden_layers,
            num_kv_heads=model.num_kv_heads,
            head_dim=arch.head_size,
            dtype=kv_dtype or param.dtype,
            device=param.device,
        )
        self.req_to_token = torch.zeros(
            max_requests, max_context, dtype=torch.int64, device=param.device
        )
        gen = torch.Generator().manual_seed(seed)
        self.free_slots = (torch.randperm(num_slots - 1, generator=gen) + 1).tolist()  # not 0
        self.cached = [0] * max_requests  # tokens in the KV cache per row
        self.attn = create_attention_backend(backend, self.pool, arch.attention_scale)

    def _allocate(self, row: int, n: int) -> torch.Tensor:
        slots = torch.tensor(self.free_slots[:n], dtype=torch.int64)
        del self.free_slots[:n]
        start = self.cached[row]
        self.req_to_token[row, start : start + n] = slots
        self.cached[row] += n
        return slots

    def make_batch(self, items: list[tuple[int, list[int]]]) -> ForwardBatch:
        prefix_lens = [self.cached[row] for row, _ in items]
        out_cache_loc = torch.cat([self._allocate(row, len(ids)) for row, ids in items])
        return ForwardBatch.build(
            input_ids=[t for _, ids in items for t in ids],
            out_cache_loc=out_cache_loc,
            req_rows=[row for row, _ in items],
            prefix_lens=prefix_lens,
            extend_lens=[len(ids) for _, ids in items],
            req_to_token=self.req_to_token,
        )

    @torch.inference_mode()
    def step(self, items: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """One forward step over (req row, new token ids) items; logits [n_i, vocab] each."""
        batch = self.make_batch(items)
        self.attn.prepare(batch)
        logits = self.model.compute_logits(self.model(batch, self.attn))  # [T, vocab]
        return list(logits.split([len(ids) for _, ids in items]))


SMALL = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
# llama3 scaling with a short original context, so that the test's positions span all
# three frequency bands (kept, ramped, divided by factor).
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
    "rope_theta": 10000.0,
}
# YaRN with a short original context, so that the test's positions cross it.
YARN_ROPE = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "rope_theta": 10000.0,
}
VARIANTS: dict[str, tuple[type, dict[str, Any]]] = {
    "llama": (transformers.LlamaConfig, {}),
    "qwen2-qkv-bias": (transformers.Qwen2Config, {}),
    # A sliding window longer than the tests' sequences: served as a context limit, and
    # within it full attention is the window's.
    "mistral": (transformers.MistralConfig, {"sliding_window": 4096}),
    # SmolLM3: its fourth layer attends without rotary.
    "smollm3": (
        transformers.SmolLM3Config,
        {"num_hidden_layers": 4, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    ),
    # Granite's four scalings, none of them 1.
    "granite": (
        transformers.GraniteConfig,
        {
            "embedding_multiplier": 2.0,
            "residual_multiplier": 0.5,
            "attention_multiplier": 0.3,
            "logits_scaling": 4.0,
        },
    ),
    # Phi-3: q/k/v and gate/up fused in the checkpoint, split at load.
    "phi3": (transformers.Phi3Config, {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    # A head size that is not hidden / heads (32 against 64 / 4), as Qwen3's models have.
    "qwen3-qk-norm": (transformers.Qwen3Config, {"head_dim": 32}),
    # Mixtures of experts: 4 experts, 2 a token; Qwen3-MoE's second layer dense, its
    # picked probabilities rescaled (Mixtral always rescales them).
    "qwen3-moe": (
        transformers.Qwen3MoeConfig,
        {
            "head_dim": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 48,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
        },
    ),
    "mixtral": (transformers.MixtralConfig, {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # Qwen2-MoE: qkv bias, unrescaled probabilities, and a gated shared expert.
    "qwen2-moe": (
        transformers.Qwen2MoeConfig,
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 24,
            "shared_expert_intermediate_size": 40,
        },
    ),
    "llama3-rope": (transformers.LlamaConfig, {"rope_parameters": LLAMA3_ROPE}),
    "qwen2-yarn": (transformers.Qwen2Config, {"rope_parameters": YARN_ROPE}),
    "linear-rope": (
        transformers.LlamaConfig,
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    ),
    "tied-mha": (
        transformers.LlamaConfig,
        {"tie_word_embeddings": True, "num_key_value_heads": 4},
    ),
}


def make_pair(
    variant: str, seed: int = 0, **settings: Any
) -> tuple[transformers.PreTrainedModel, LlamaForCausalLM]:
    """A random transformers model and ours with the same weights; `settings` override the
    variant's settings (e.g. hidden_size)."""
    config_class, overrides = VARIANTS[variant]
    config = config_class(**{**SMALL, **overrides, **settings}, attn_implementation="eager")
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    # Default init (std 0.02, unit norms, zero biases) would hide mistakes in the norms and
    # biases and make attention nearly uniform; use larger, nonzero values everywhere.
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    arch = LlamaArchConfig.from_hf_dict(config.to_dict())
    ours = LlamaForCausalLM(arch)
    ours.load_weights(checkpoint_tensors(hf, arch).items())
    return hf, ours


def checkpoint_tensors(
    hf: transformers.PreTrainedModel, arch: LlamaArchConfig
) -> dict[str, torch.Tensor]:
    """The model's tensors under the names its checkpoint stores. transformers keeps a
    mixture of experts' weights stacked in memory (`experts.gate_up_proj` [E, 2I, H], gate
    rows first, and `experts.down_proj` [E, H, I]) and saves them one tensor per expert
    and projection, the hub's layout (`save_pretrained` writes that; it is not called
    here because under torch.distributed it writes from one rank only)."""
    block, gate, up, down = arch.expert_names
    tensors: dict[str, torch.Tensor] = {}
    for name, t in hf.state_dict().items():
        if name.endswith(".experts.gate_up_proj"):
            layer = name.removesuffix("mlp.experts.gate_up_proj")
            gates, ups = t.chunk(2, dim=1)
            for e, (g, u) in enumerate(zip(gates, ups, strict=True)):
                tensors[f"{layer}{block}.experts.{e}.{gate}.weight"] = g.clone()
                tensors[f"{layer}{block}.experts.{e}.{up}.weight"] = u.clone()
        elif name.endswith(".experts.down_proj"):
            layer = name.removesuffix("mlp.experts.down_proj")
            for e, d in enumerate(t):
                tensors[f"{layer}{block}.experts.{e}.{down}.weight"] = d.clone()
        elif name.endswith("mlp.gate.weight") and arch.num_experts:
            tensors[name.removesuffix("mlp.gate.weight") + f"{block}.gate.weight"] = t
        else:
            tensors[name] = t
    return tensors


@torch.no_grad()
def hf_logits(hf: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    return hf(torch.tensor([ids])).logits[0].float()  # [S, vocab]


def random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(
        0, SMALL["vocab_size"], (n,), generator=torch.Generator().manual_seed(seed)
    ).tolist()


def write_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level tokenizer of the test model's vocabulary (token i is "<i>")."""
    tok = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({f"<{i}>": i for i in range(vocab_size)}, unk_token="<0>")
    )
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')

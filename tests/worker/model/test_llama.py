"""Our LlamaForCausalLM against transformers' on the same random weights, logit by logit."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

from radixmesh.worker.model.arch import LlamaArchConfig
from radixmesh.worker.model.llama import LlamaForCausalLM
from tests.worker.model.helpers import (
    SMALL,
    VARIANTS,
    RaggedRunner,
    checkpoint_tensors,
    hf_logits,
    make_pair,
    random_ids,
)

ATOL = 1e-5


def test_arch_from_config() -> None:
    _, ours = make_pair("llama3-rope")
    assert ours.arch.rope_scaling is not None
    assert ours.arch.rope_scaling["rope_type"] == "llama3"
    _, qwen = make_pair("qwen2-qkv-bias")
    assert qwen.arch.attention_bias
    _, mistral = make_pair("mistral")
    assert (mistral.arch.sliding_window, mistral.arch.context_limit) == (4096, 256)


def test_a_sliding_window_caps_the_context_only_where_it_applies() -> None:
    base: dict[str, Any] = {**SMALL, "max_position_embeddings": 32768}
    mistral = transformers.MistralConfig(**base, sliding_window=4096).to_dict()
    assert LlamaArchConfig.from_hf_dict(mistral).context_limit == 4096
    # Qwen's configs name a window but apply it only with use_sliding_window.
    qwen = transformers.Qwen2Config(**base, sliding_window=4096, use_sliding_window=False)
    arch = LlamaArchConfig.from_hf_dict(qwen.to_dict())
    assert (arch.sliding_window, arch.context_limit) == (None, 32768)
    for a in (arch, LlamaArchConfig.from_hf_dict(mistral)):  # through the weight cache's config
        again = LlamaArchConfig.from_hf_dict(a.to_hf_dict())
        assert (again.sliding_window, again.context_limit) == (a.sliding_window, a.context_limit)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_full_prompt_in_one_extend(variant: str) -> None:
    hf, ours = make_pair(variant)
    ids = random_ids(150, seed=1)
    (got,) = RaggedRunner(ours).step([(3, ids)])
    ref = hf_logits(hf, ids)
    assert ref.abs().max() > 1.0  # logits of a meaningful scale, not a near-zero model
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_chunked_prefill_then_batched_decode(variant: str) -> None:
    hf, ours = make_pair(variant)
    a, b, c = random_ids(100, seed=2), random_ids(40, seed=3), random_ids(6, seed=4)
    runner = RaggedRunner(ours)
    got: dict[int, list[torch.Tensor]] = {0: [], 1: [], 2: []}

    def step(*items: tuple[int, list[int]]) -> None:
        for (row, _), logits in zip(items, runner.step(list(items)), strict=True):
            got[row].append(logits)

    step((0, a[:30]))  # first chunk of a
    step((1, b[:25]), (0, a[30:64]))  # a's second chunk attends to the first's KV
    # Mixed step: b's last chunk, a decode-like 1-token chunk of a, c's one-token prompt.
    step((1, b[25:34]), (0, a[64:65]), (2, c[:1]))
    step((0, a[65:90]), (2, c[1:2]))
    for i in range(6):  # decode, three sequences of different lengths in one batch
        items = [(0, a[90 + i : 91 + i]), (1, b[34 + i : 35 + i])]
        step(*(items if i >= 4 else [*items, (2, c[2 + i : 3 + i])]))
    for row, ids, n in ((0, a, 96), (1, b, 40), (2, c, 6)):
        torch.testing.assert_close(torch.cat(got[row]), hf_logits(hf, ids[:n]), atol=ATOL, rtol=0)


def test_decode_matches_greedy_generation() -> None:
    hf, ours = make_pair("llama")
    assert isinstance(hf, transformers.GenerationMixin)  # a causal LM generates
    prompt = random_ids(20, seed=5)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0]
    runner = RaggedRunner(ours)
    (logits,) = runner.step([(0, prompt)])
    out = [int(logits[-1].argmax())]
    for _ in range(11):
        (logits,) = runner.step([(0, out[-1:])])
        out.append(int(logits[-1].argmax()))
    assert out == ref[20:].tolist()


def test_compute_logits_on_selected_rows() -> None:
    _, ours = make_pair("tied-mha")
    hidden = torch.randn(3, SMALL["hidden_size"])
    logits = ours.compute_logits(hidden)
    assert logits.dtype == torch.float32 and logits.shape == (3, SMALL["vocab_size"])
    assert ours.lm_head.weight is ours.model.embed_tokens.weight


def hf_weights(variant: str = "llama") -> dict[str, torch.Tensor]:
    hf, _ = make_pair(variant)
    return dict(hf.state_dict())


def fresh(variant: str = "llama") -> LlamaForCausalLM:
    config_class, overrides = VARIANTS[variant]
    cfg = config_class(**{**SMALL, **overrides})
    return LlamaForCausalLM(LlamaArchConfig.from_hf_dict(cfg.to_dict()))


def test_load_weights_rejects_missing_weight() -> None:
    weights = hf_weights()
    del weights["model.layers.1.self_attn.k_proj.weight"]
    with pytest.raises(ValueError, match=r"missing weights: model\.layers\.1\.self_attn\.k_proj"):
        fresh().load_weights(weights.items())


def test_load_weights_rejects_unexpected_weight() -> None:
    weights = hf_weights()
    weights["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)  # llama has no bias
    with pytest.raises(ValueError, match=r"unexpected weight 'model\.layers\.0\.self_attn\.q_"):
        fresh().load_weights(weights.items())


def test_load_weights_rejects_wrong_shape() -> None:
    weights = hf_weights()
    weights["model.layers.0.mlp.up_proj.weight"] = torch.zeros(100, 64)
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.mlp\.up_proj\.weight'.*shape"):
        fresh().load_weights(weights.items())
    weights = hf_weights()
    weights["model.norm.weight"] = torch.zeros(65)
    with pytest.raises(ValueError, match=r"'model\.norm\.weight'.*shape"):
        fresh().load_weights(weights.items())


def test_load_weights_rejects_duplicates_and_ignores_derived_tensors() -> None:
    weights = list(hf_weights().items())
    model = fresh()
    with pytest.raises(ValueError, match="given twice"):
        model.load_weights([*weights, weights[0]])
    extra = ("model.layers.0.self_attn.rotary_emb.inv_freq", torch.zeros(8))
    fresh().load_weights([*weights, extra])


def test_tied_model_accepts_a_redundant_lm_head() -> None:
    weights = hf_weights("tied-mha")
    assert "lm_head.weight" not in weights or weights["lm_head.weight"] is not None
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    fresh("tied-mha").load_weights(weights.items())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    ("variant", "dtype", "atol"),
    [
        ("qwen2-qkv-bias", torch.float32, 1e-4),
        ("qwen2-qkv-bias", torch.bfloat16, 0.25),
        ("qwen3-qk-norm", torch.float32, 1e-4),  # the fused norm + rotary kernel
        ("qwen3-qk-norm", torch.bfloat16, 0.25),
        # The grouped-GEMM experts; float32 only: bfloat16 rounding may flip a token's
        # choice of experts against the float32 reference, which no tolerance bounds.
        ("qwen3-moe", torch.float32, 1e-4),
        ("mixtral", torch.float32, 1e-4),
        ("qwen2-moe", torch.float32, 1e-4),
    ],
)
def test_cuda_matches_transformers_on_cpu(variant: str, dtype: torch.dtype, atol: float) -> None:
    hf, cpu_model = make_pair(variant)
    ours = LlamaForCausalLM(cpu_model.arch, dtype=dtype, device="cuda")
    ours.load_weights(checkpoint_tensors(hf, cpu_model.arch).items())
    a, b = random_ids(70, seed=6), random_ids(9, seed=7)
    runner = RaggedRunner(ours)
    (a1,) = runner.step([(0, a[:40])])
    a2, b1 = runner.step([(0, a[40:60]), (1, b)])
    steps = [runner.step([(1, [a[i]]), (0, [a[60 + i]])]) for i in range(4)]
    got_a = torch.cat([a1, a2, *(s[1] for s in steps)]).cpu()
    got_b = torch.cat([b1, *(s[0] for s in steps)]).cpu()
    torch.testing.assert_close(got_a, hf_logits(hf, a[:64]), atol=atol, rtol=0)
    torch.testing.assert_close(got_b, hf_logits(hf, b + a[:4]), atol=atol, rtol=0)

"""SparseMoE (layers/moe.py) against a token-by-token float64 reference, its weight loaders
under tensor parallelism, and a mixture-of-experts checkpoint served by the Engine with
transformers' greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from radixmesh.errors import InvalidArgument
from radixmesh.worker.engine import Engine
from radixmesh.worker.layers.moe import SparseMoE
from radixmesh.worker.layers.parallel import TPGroup
from tests.worker.model.helpers import hf_logits, make_pair, random_ids, write_tokenizer

H, I, E, K = 24, 16, 6, 2


def checkpoint(seed: int) -> dict[str, torch.Tensor]:
    """An expert block's tensors under Qwen's names: the router, then each expert's."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {"gate.weight": torch.randn(E, H, generator=gen)}
    for e in range(E):
        tensors[f"{e}.gate"] = 0.3 * torch.randn(I, H, generator=gen)
        tensors[f"{e}.up"] = 0.3 * torch.randn(I, H, generator=gen)
        tensors[f"{e}.down"] = 0.3 * torch.randn(H, I, generator=gen)
    return tensors


def load(moe: SparseMoE, tensors: dict[str, torch.Tensor]) -> SparseMoE:
    moe.gate.weight.data.copy_(tensors["gate.weight"])
    for e in range(E):
        moe.w13.weight_loader(moe.w13, tensors[f"{e}.gate"], (e, 0))  # type: ignore[attr-defined]
        moe.w13.weight_loader(moe.w13, tensors[f"{e}.up"], (e, 1))  # type: ignore[attr-defined]
        moe.w2.weight_loader(moe.w2, tensors[f"{e}.down"], (e, 0))  # type: ignore[attr-defined]
    return moe


def reference(x: torch.Tensor, tensors: dict[str, torch.Tensor], renormalize: bool) -> torch.Tensor:
    """Each token on its own, in float64: softmax over the experts, its top K, their MLPs."""
    t = {k: v.double() for k, v in tensors.items()}
    out = torch.zeros(x.shape, dtype=torch.float64)
    for row, token in enumerate(x.double()):
        probs = torch.softmax(t["gate.weight"] @ token, dim=-1)
        weights, experts = torch.topk(probs, K)
        if renormalize:
            weights = weights / weights.sum()
        for w, e in zip(weights.tolist(), experts.tolist(), strict=True):
            act = F.silu(t[f"{e}.gate"] @ token) * (t[f"{e}.up"] @ token)
            out[row] += w * (t[f"{e}.down"] @ act)
    return out


@pytest.mark.parametrize("renormalize", [True, False])
def test_matches_the_token_by_token_reference(renormalize: bool) -> None:
    tensors = checkpoint(seed=1)
    moe = load(SparseMoE(H, I, E, K, renormalize=renormalize, dtype=torch.float32), tensors)
    x = torch.randn(37, H, generator=torch.Generator().manual_seed(2))
    experts, _ = moe.route(x)
    assert len(set(experts.flatten().tolist())) == E  # every expert has tokens
    torch.testing.assert_close(
        moe(x).double(), reference(x, tensors, renormalize), atol=1e-5, rtol=0
    )


def test_a_lone_token_reaches_only_its_experts() -> None:
    tensors = checkpoint(seed=3)
    moe = load(SparseMoE(H, I, E, K, renormalize=True, dtype=torch.float32), tensors)
    x = torch.randn(1, H, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(moe(x).double(), reference(x, tensors, True), atol=1e-5, rtol=0)


def test_tensor_parallel_ranks_sum_to_the_whole() -> None:
    """Two ranks, each with its half of every expert's intermediate size: their partial
    outputs (before the all-reduce, which the fake group skips) add up to one rank's."""
    tensors = checkpoint(seed=5)
    x = torch.randn(19, H, generator=torch.Generator().manual_seed(6))
    whole = load(SparseMoE(H, I, E, K, renormalize=True, dtype=torch.float32), tensors)(x)
    parts = []
    for rank in range(2):
        tp = TPGroup(rank=rank, size=2, fast_all_reduce=lambda _: True)  # no collective
        moe = load(SparseMoE(H, I, E, K, renormalize=True, tp=tp, dtype=torch.float32), tensors)
        assert tuple(moe.w13.shape) == (E, I, H) and tuple(moe.w2.shape) == (E, H, I // 2)
        torch.testing.assert_close(moe.w13[2, : I // 2], tensors["2.gate"][rank * 8 : rank * 8 + 8])
        parts.append(moe(x))
    torch.testing.assert_close(parts[0] + parts[1], whole, atol=1e-5, rtol=0)


def test_bad_expert_tensors_name_what_is_wrong() -> None:
    moe = SparseMoE(H, I, E, K, renormalize=True, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"shape mismatch: expected \(16, 24\), got \(8, 24\)"):
        moe.w13.weight_loader(moe.w13, torch.zeros(8, H), (0, 0))  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="expected an \\(expert, piece\\) shard, got 6"):
        moe.w2.weight_loader(moe.w2, torch.zeros(H, I), 6)  # type: ignore[attr-defined]


def test_an_engine_serves_a_qwen3_moe_checkpoint_with_transformers_greedy_tokens(
    tmp_path: Path,
) -> None:
    """A small random Qwen3-MoE (one sparse and one dense layer) saved as a Hugging Face
    directory: the Engine's greedy tokens for three prompts run together equal
    transformers' for each alone. Each step's top two logits differ by far more than the
    two implementations do (1e-5), so no step is a near tie."""
    hf, _ = make_pair("qwen3-moe", seed=3)
    assert isinstance(hf, transformers.GenerationMixin)
    hf.save_pretrained(tmp_path)
    write_tokenizer(tmp_path, hf.config.vocab_size)
    prompts = [random_ids(n, seed=10 + n) for n in (5, 17, 30)]
    expected = []
    for prompt in prompts:
        with torch.no_grad():
            ids = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0]
        expected.append(ids[len(prompt) :].tolist())
        top2 = hf_logits(hf, ids.tolist())[len(prompt) - 1 : -1].topk(2).values
        assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-3
    engine = Engine(str(tmp_path), dtype="float32", kv_cache_tokens=512, max_running_requests=4)
    try:
        assert engine.worker.arch.architecture == "Qwen3MoeForCausalLM"
        params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        assert isinstance(outs, list)
        assert [o["output_ids"] for o in outs if isinstance(o, dict)] == expected
    finally:
        engine.shutdown()


def test_deterministic_mode_refuses_a_mixture_of_experts() -> None:
    with pytest.raises(InvalidArgument, match="mixture-of-experts") as e:
        Engine("dummy:tiny-moe", deterministic=True)
    assert e.value.field == "deterministic"

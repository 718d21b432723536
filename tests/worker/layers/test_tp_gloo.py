"""The whole model at tensor parallelism 2 over real collectives (gloo on CPU).

Two processes each build a rank of the model from the same full weights; their logits
must equal transformers' on every position of a chunked-prefill + decode schedule. This
exercises what single-process tests cannot: the all-reduce of row-parallel layers and of
the vocab-parallel embedding, and the all-gather of the LM head.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from radixmesh.worker.layers.parallel import TPGroup
from radixmesh.worker.model.llama import LlamaForCausalLM
from tests.worker.model.helpers import (
    RaggedRunner,
    checkpoint_tensors,
    hf_logits,
    make_pair,
    random_ids,
)

TP = 2
# The mixtures of experts split every expert's intermediate size and all-reduce the sum.
# Phi-3's fused checkpoint tensors are split, then sharded.
VARIANTS = ["llama", "qwen2-qkv-bias", "tied-mha", "qwen3-moe", "mixtral", "qwen2-moe", "phi3"]


def schedule(runner: RaggedRunner, a: list[int], b: list[int]) -> list[torch.Tensor]:
    """Chunked prefill of a, then a and b together, then three batched decode steps."""
    out = runner.step([(0, a[:20])])
    out += runner.step([(0, a[20:33]), (1, b)])
    for i in range(3):
        out += runner.step([(1, [a[i]]), (0, [a[33 + i]])])
    return out


def _rank_main(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=TP)
    torch.set_num_threads(1)
    try:
        for variant in VARIANTS:
            hf, full = make_pair(variant)  # seeded: the same weights on every rank
            model = LlamaForCausalLM(full.arch, tp=TPGroup(rank, TP))
            model.load_weights(checkpoint_tensors(hf, full.arch).items())
            logits = schedule(RaggedRunner(model), random_ids(36, 7), random_ids(9, 8))
            if rank == 0:
                torch.save(logits, Path(out_dir) / f"{variant}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_tp2_matches_transformers(tmp_path: Path) -> None:
    mp.spawn(_rank_main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=TP, join=True)
    a, b = random_ids(36, 7), random_ids(9, 8)
    for variant in VARIANTS:
        hf, _ = make_pair(variant)
        got = torch.load(tmp_path / f"{variant}.pt")
        ref_a, ref_b = hf_logits(hf, a), hf_logits(hf, b + a[:3])
        want = [ref_a[:20], ref_a[20:33], ref_b[:9]]
        for i in range(3):
            want += [ref_b[9 + i : 10 + i], ref_a[33 + i : 34 + i]]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=2e-5, rtol=0)

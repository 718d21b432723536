"""Deterministic mode through the triton attention backend (interpreter on CPU, or CUDA):
prompts sharing prefixes of 1, 63 and 130 tokens give, served over their cached prefix
(matched down to a multiple of the block), the bits of their cold prefill. With the mode
off, the same check finds two distinct outputs (logprob bits) for one of the prompts."""

from __future__ import annotations

import triton  # noqa: F401  (a dev dependency: missing must fail, not skip)

from bench.deterministic import run_prefix
from radixmesh.worker.engine import Engine


def test_cached_prefixes_give_the_cold_prefill_bits() -> None:
    eng = Engine(
        "dummy:tiny",
        device="cpu",
        dtype="float32",
        attention_backend="triton",
        deterministic=True,
        kv_cache_tokens=4096,
        max_num_batched_tokens=64,  # chunked prefill, cut at multiples of the block
    )
    try:
        vocab = eng.worker.arch.vocab_size
        got = run_prefix(eng, vocab, [1, 63, 129], 1, 4)
        assert (got["tokens"], got["exact"]) == (1, 1)
        assert [c["first_divergence"] for c in got["per_prefix"].values()] == [None] * 3
    finally:
        eng.shutdown()

"""KV pool auto-sizing: the arithmetic with injected numbers (any machine), the profile
step on the real dummy model (CPU), the CPU default, and on CUDA the sized pool; the batch
sizes that follow the pool (the running cap and the CUDA graphs)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixmesh.errors import InvalidArgument
from radixmesh.worker.config import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    CacheConfig,
    EngineConfig,
    batch_defaults,
    fit_running_to_pool,
)
from radixmesh.worker.kvcache.pool import KVPool
from radixmesh.worker.pool_sizing import (
    GIB,
    MAX_AUTO_SLOTS,
    ProfileStep,
    decode_workspace_bytes,
    fit_batches_to_pool,
    flashinfer_reserve_bytes,
    graph_batch_within_budget,
    graph_max_batch_size,
    graph_reserve_bytes,
    profile_lengths,
    shared_graph_workspace_bytes,
    size_pool,
)
from tests.worker.factories import make_worker


def test_size_pool_takes_the_fraction_of_what_is_left() -> None:
    s = size_pool(
        free_bytes=10_000_000,
        activation_bytes=1_000_000,
        graph_bytes=500_000,
        bytes_per_slot=1000,
        mem_fraction=0.9,
        page_size=1,
    )
    assert s.num_slots == 7650  # 0.9 * 8_500_000 / 1000
    assert s.num_tokens == 7649  # the reserved padding slot
    assert s.pool_bytes == 7_650_000


def test_size_pool_rounds_down_to_whole_pages() -> None:
    s = size_pool(
        free_bytes=10_000_000,
        activation_bytes=1_000_000,
        graph_bytes=500_000,
        bytes_per_slot=1000,
        mem_fraction=0.9,
        page_size=16,
    )
    assert s.num_slots == 7648
    assert s.num_tokens == 7632


def test_a_small_model_on_a_large_gpu_is_capped() -> None:
    s = size_pool(
        free_bytes=130 * GIB,
        activation_bytes=GIB,
        graph_bytes=0,
        bytes_per_slot=512,  # dummy:tiny-sized: ~250M slots uncapped
        mem_fraction=0.9,
        page_size=16,
    )
    assert s.num_slots == MAX_AUTO_SLOTS == 16_777_216


def test_llama_3_8b_on_an_h200_gets_850k_kv_tokens() -> None:
    # Llama-3-8B in bf16: 2 * 32 layers * 8 KV heads * 128 * 2 bytes = 128 KiB per token.
    per_slot = KVPool.bytes_per_slot(32, 8, 128, torch.bfloat16)
    assert per_slot == 131072
    s = size_pool(
        free_bytes=int(123.5 * GIB),  # ~139 GiB less ~15 GiB of weights and the context
        activation_bytes=int(1.5 * GIB),
        graph_bytes=int(0.25 * GIB),
        bytes_per_slot=per_slot,
        mem_fraction=0.9,
        page_size=1,
    )
    assert s.num_slots == 897_638  # int(0.9 * 121.75 GiB) // 128 KiB
    assert s.num_tokens >= 850_000
    assert "897637 tokens at 131072 bytes per token" in s.describe()
    assert "0.25 GiB CUDA graphs (batches to 0)" in s.describe()


def test_size_pool_without_room_raises() -> None:
    with pytest.raises(MemoryError, match="no device memory left for the KV cache"):
        size_pool(
            free_bytes=1_000_000,
            activation_bytes=999_000,
            graph_bytes=0,
            bytes_per_slot=1000,
            mem_fraction=0.9,
            page_size=1,
        )
    with pytest.raises(MemoryError):  # activations alone exceed what is free
        size_pool(
            free_bytes=1_000,
            activation_bytes=5_000,
            graph_bytes=0,
            bytes_per_slot=10,
            mem_fraction=0.9,
            page_size=1,
        )


def test_graph_reserve_scales_the_profile_to_the_largest_graph_batch() -> None:
    assert graph_reserve_bytes(8_192_000, 8192, 256, 1000) == 256_000 + 1000
    assert graph_reserve_bytes(8_192_000, 8192, 0, 1000) == 0  # no graphs
    assert graph_reserve_bytes(4096, 64, 256, 10) == 4096 + 10  # batch over the profile


def test_shared_graph_workspace_bytes() -> None:
    # 4 bytes * B * heads * (2 prefix + 1 own splits) * (D + 1), once at the largest B
    assert shared_graph_workspace_bytes(256, 32, 128) == 4 * 256 * 32 * 3 * 129


def test_decode_workspace_bytes() -> None:
    # 4 bytes * B * heads * splits * (D + 1), summed over the ladder
    assert decode_workspace_bytes([1, 2], lambda bs: 3, num_heads=2, head_dim=4) == 360
    assert decode_workspace_bytes([4], lambda bs: 8 // bs, num_heads=1, head_dim=1) == 64


def test_flashinfer_reserve_counts_its_workspaces_and_the_graph_index_buffer() -> None:
    from radixmesh.worker.attention.flashinfer_backend import INT_WORKSPACE_BYTES, WORKSPACE_BYTES

    eager = WORKSPACE_BYTES + 2 * INT_WORKSPACE_BYTES  # the decode and prefill wrappers
    assert flashinfer_reserve_bytes(0, 4096) == eager
    # Graphs to 8: ladder 1, 2, 4, 8 -> 4 more wrappers; int32 indices, 8 rows x 4,096.
    want = WORKSPACE_BYTES + (4 + 2) * INT_WORKSPACE_BYTES + 4 * 8 * 4096
    assert flashinfer_reserve_bytes(8, 4096) == want


def test_profile_lengths() -> None:
    assert profile_lengths(10, 4) == [4, 4, 2]
    assert profile_lengths(8, 4) == [4, 4]
    assert profile_lengths(3, 4) == [3]


def test_mem_fraction_is_validated() -> None:
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(InvalidArgument) as err:
            CacheConfig(mem_fraction=bad)
        assert err.value.field == "mem_fraction"
    with pytest.raises(InvalidArgument) as err:
        CacheConfig(kv_cache_bytes=0)
    assert err.value.field == "kv_cache_bytes"


def test_profile_step_runs_the_largest_step_on_its_own_pool() -> None:
    w = make_worker(device="cpu")
    arch = w.arch
    step = ProfileStep(
        w.model,
        "torch",
        num_tokens=40,
        max_seq_len=16,
        num_layers=arch.num_hidden_layers,
        head_dim=arch.head_size,
        dtype=w.dtype,
        device=w.device,
    )
    assert step.pool.num_slots == 41
    assert step.batch.extend_lens_cpu == [16, 16, 8]
    assert step.batch.out_cache_loc.tolist() == list(range(1, 41))
    ids = step.run(num_sample_rows=6, vocab_size=arch.vocab_size)
    assert len(ids) == 6 and all(0 <= t < arch.vocab_size for t in ids)
    assert int(step.pool.k_buffers[0][1:].abs().sum() > 0) == 1  # the step wrote its KV
    assert int(w.kv_pool.k_buffers[0].abs().sum()) == 0  # ...and not into the worker's


def test_cpu_default_is_the_fixed_budget() -> None:
    w = make_worker(device="cpu", kv_cache_tokens=None)
    arch = w.arch
    per_slot = KVPool.bytes_per_slot(
        arch.num_hidden_layers, arch.num_key_value_heads, arch.head_size, w.dtype
    )
    assert w.pool_sizing is None
    assert w.kv_pool.num_slots == DEFAULT_CPU_KV_CACHE_BYTES // per_slot


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_default_sizes_the_pool_from_free_memory() -> None:
    # A small fraction: dummy:tiny needs ~0.5 KiB per token, 0.9 of an H200 is ~250M slots.
    w = make_worker(
        device="cuda", kv_cache_tokens=None, cuda_graph_max_batch_size=16, mem_fraction=0.05
    )
    s = w.pool_sizing
    assert s is not None and s.activation_bytes > 0 and s.graph_bytes > 0
    assert s.mem_fraction == 0.05
    assert w.kv_pool.num_slots == s.num_slots
    assert w.kv_pool.nbytes == s.pool_bytes
    # The pool took its share; what it left covers activations and graphs, with slack.
    free_after, _ = torch.cuda.mem_get_info()
    assert free_after + w.graph_memory_bytes >= s.activation_bytes + s.graph_bytes


def test_fp8_kv_holds_about_twice_the_tokens_of_bf16() -> None:
    # Llama-3-8B: 128 values + one scale exponent per token, KV head and layer, for K and V.
    fp8_per_slot = KVPool.bytes_per_slot(32, 8, 128, torch.float8_e4m3fn)
    assert fp8_per_slot == 2 * 32 * 8 * (128 + 1) == 66048
    sizes = {}
    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        sizes[dtype] = size_pool(
            free_bytes=int(123.5 * GIB),
            activation_bytes=int(1.5 * GIB),
            graph_bytes=int(0.25 * GIB),
            bytes_per_slot=KVPool.bytes_per_slot(32, 8, 128, dtype),
            mem_fraction=0.9,
            page_size=1,
        ).num_tokens
    assert sizes[torch.float8_e4m3fn] / sizes[torch.bfloat16] >= 1.98  # 256 / 129 = 1.984


@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp8_pool_bytes_per_token_against_a_16_bit_pool(head_dim: int) -> None:
    ratio = KVPool.bytes_per_slot(30, 3, head_dim, torch.bfloat16) / KVPool.bytes_per_slot(
        30, 3, head_dim, torch.float8_e4m3fn
    )
    assert ratio == 2 * head_dim / (head_dim + 1) >= 1.9


def test_fp8_kv_pool_of_a_worker_in_the_same_budget() -> None:
    slots = {}
    for kv_dtype in ("auto", "fp8"):
        w = make_worker(
            dtype="bfloat16", kv_cache_tokens=None, kv_cache_bytes=1 << 22, kv_cache_dtype=kv_dtype
        )
        try:
            assert w.kv_pool.nbytes <= 1 << 22
            assert w.kv_pool.quantized == (kv_dtype == "fp8")
            slots[kv_dtype] = w.kv_pool.num_slots
        finally:
            w.close()  # gives the pool back
    # dummy:tiny, 2 layers x 2 KV heads x head_dim 16: 256 bytes a token in bfloat16,
    # 2 x 2 x 2 x (16 + 1) = 136 in FP8 (a small head_dim pays more for its scale byte).
    assert slots == {"auto": (1 << 22) // 256, "fp8": (1 << 22) // 136}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_auto_sized_fp8_pool_holds_about_twice_the_tokens() -> None:
    # SmolLM2's shape (head_dim 64): an FP8 token costs 65 bytes a head where bf16's costs 128.
    w = make_worker(
        "dummy:smollm2-135m",
        device="cuda",
        dtype="bfloat16",
        kv_cache_tokens=None,
        kv_cache_dtype="fp8",
        cuda_graph_max_batch_size=16,
        mem_fraction=0.05,
    )
    s = w.pool_sizing
    quantized, nbytes = w.kv_pool.quantized, w.kv_pool.nbytes
    w.close()  # gives the pool back
    assert s is not None and quantized
    assert s.bytes_per_slot == KVPool.bytes_per_slot(30, 3, 64, torch.float8_e4m3fn)
    assert nbytes == s.pool_bytes
    bf16 = size_pool(
        free_bytes=s.free_bytes,
        activation_bytes=s.activation_bytes,
        graph_bytes=s.graph_bytes,
        bytes_per_slot=KVPool.bytes_per_slot(30, 3, 64, torch.bfloat16),
        mem_fraction=s.mem_fraction,
        page_size=s.page_size,
    )
    assert s.num_tokens / bf16.num_tokens >= 1.9


def cuda_config(**options: object) -> EngineConfig:
    """A config as the worker has it on an H200 before the pool is sized."""
    config = EngineConfig.from_options(**options)
    sc = batch_defaults(config.scheduler, "cuda", 141 * GIB)
    return dataclasses.replace(config, scheduler=sc)


@pytest.mark.parametrize(
    ("pool_tokens", "running", "graphs"),
    [
        (897_413, 876, 512),  # Llama-3-8B, bf16 KV: 897,413 / 1,024
        (1_776_000, 1024, 512),  # FP8 KV: the ceiling (the peer shapes' best by hand)
        (64_000, 62, 512),  # graphed prompt rows (362) + 4 x 62 forced tokens: past 512
        (1_000, 16, 426),  # the floor; 16 x 4 + 362
    ],
)
def test_batch_sizes_follow_the_pool(pool_tokens: int, running: int, graphs: int) -> None:
    c = fit_batches_to_pool(cuda_config(), pool_tokens, auto_running=True, graph_limit=512)
    assert (c.scheduler.running_cap, c.model.cuda_graph_max_batch_size) == (running, graphs)
    assert graph_max_batch_size(c) == graphs


def test_graphs_follow_the_running_cap_alone_without_graphed_extra_rows() -> None:
    plain = cuda_config(jump_forward_decode_rows=False, cuda_graph_prefill_reads=0)
    c = fit_batches_to_pool(plain, 64_000, auto_running=True, graph_limit=512)
    assert (c.scheduler.running_cap, c.model.cuda_graph_max_batch_size) == (62, 62)


def test_graphs_stay_within_the_limit_the_pool_sizing_reserved() -> None:
    c = fit_batches_to_pool(cuda_config(), 897_413, auto_running=True, graph_limit=128)
    assert (c.scheduler.running_cap, c.model.cuda_graph_max_batch_size) == (876, 128)


def test_given_batch_sizes_are_kept() -> None:
    given = cuda_config(max_running_requests=300, cuda_graph_max_batch_size=64)
    c = fit_batches_to_pool(given, 64_000, auto_running=False, graph_limit=512)
    assert (c.scheduler.running_cap, c.model.cuda_graph_max_batch_size) == (300, 64)
    off = cuda_config(cuda_graph_max_batch_size=0)
    assert fit_batches_to_pool(off, 64_000, auto_running=True, graph_limit=512).model == off.model


def test_before_the_pool_the_running_cap_is_what_the_largest_pool_could_hold() -> None:
    # auto_size_pool's first step: 6 GiB free at 128 KiB a token (a 24 GiB GPU with an 8B
    # model in bf16) could hold 49,152 tokens, so the profile samples 48 rows, not 1,024.
    sc = cuda_config().scheduler
    assert fit_running_to_pool(sc, 6 * GIB // 131072).running_cap == 48


def test_graph_batch_within_budget_walks_down_the_ladder() -> None:
    def per_row(bs: int) -> int:
        return 1000 * bs

    assert graph_batch_within_budget(512, 10**9, per_row) == 512
    assert graph_batch_within_budget(512, 300_000, per_row) == 288  # the ladder's multiples of 16
    assert graph_batch_within_budget(512, 12_000, per_row) == 8
    assert graph_batch_within_budget(512, 999, per_row) == 0  # not even one row: no graphs
    assert graph_batch_within_budget(0, 10**9, per_row) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_auto_batch_sizes_follow_the_sized_pool() -> None:
    # dummy:tiny: 512 bytes a token, so even 0.05 of a GPU holds millions of tokens.
    w = make_worker(
        device="cuda",
        kv_cache_tokens=None,
        max_running_requests=None,
        mem_fraction=0.05,
    )
    try:
        s = w.pool_sizing
        assert s is not None and s.graph_batch_size == 512
        assert w.config.scheduler.running_cap == w.req_table.max_requests == 1024
        assert w.config.model.cuda_graph_max_batch_size == 512
        graphs = w.runner.decode_graphs
        assert graphs is not None and graphs.ladder[-1] == 512
    finally:
        w.close()

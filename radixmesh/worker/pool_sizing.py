"""How many KV slots the pool gets on a GPU when no size was asked for.

After the weights load, the device's free memory has three users left: the activations
of the largest forward step (measured by one profile forward at the step's token budget,
with logits and sampling for the most rows a step can sample), the CUDA graphs' private
memory (estimated from that profile: their batches are at most the graph ladder's largest
decode batch) and the KV pool. The pool takes `mem_fraction` of what the first two leave;
the rest is slack for allocator fragmentation and other small allocations (cuBLAS
workspaces, NCCL buffers).

The batch sizes left unset follow the pool (`fit_batches_to_pool`): the running cap from
the pool's tokens (config.fit_running_to_pool), the decode graphs up to what that cap can
use. Before the pool is sized, the cap is bounded by what the largest pool the free
memory allows could hold, so the profile samples, and the graph reserve covers, no more
rows than can ever run; and an auto graph ladder stops where its reserve would pass
GRAPH_MEMORY_FRACTION of the memory the pool and the graphs share
(`graph_batch_within_budget`).

`size_pool`, `graph_batch_within_budget` and `fit_batches_to_pool` are the arithmetic
alone, so they are tested with injected numbers on any machine; `ProfileStep` runs the
real model (on any device) and `profile_peak_bytes` measures its CUDA peak.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.attention.registry import create_attention_backend
from radixmesh.worker.config import CUDA_GRAPH_MAX_BATCH_SIZE, EngineConfig, fit_running_to_pool
from radixmesh.worker.forward_batch import ForwardBatch
from radixmesh.worker.kvcache.pool import KVPool
from radixmesh.worker.model.arch import LlamaArchConfig
from radixmesh.worker.model.llama import LlamaForCausalLM
from radixmesh.worker.sampler import Sampler, SamplingRow

GIB = 1 << 30
# The most slots auto-sizing gives: a small model on a large GPU would otherwise get
# hundreds of millions of slots (dummy:tiny on an H200: ~250M), and the allocator's and
# radix cache's host-side arrays grow with the slot count (~16 bytes per slot). 16M
# tokens is ~18x what Llama-3-8B gets on an H200 (897k).
MAX_AUTO_SLOTS = 1 << 24
# Device memory a worker's process holds outside PyTorch's caching allocator: the CUDA
# context, cuBLAS / Triton workspaces (about 0.5-0.8 GiB seen with torch 2.11 on an H200).
CUDA_CONTEXT_BYTES = 1 << 30
# The most an auto-sized graph ladder may reserve, as a share of what the weights and the
# activations leave (the memory the graphs and the KV pool share): graphs save kernel
# launches, a few percent of a step at large batches, so they may not take more than a
# few percent of the KV cache. On an H200 this never binds (Llama-3-8B's reserve for
# graphs to 512 is ~0.1% of it); it does on a small share of a GPU (gpu_memory_share).
GRAPH_MEMORY_FRACTION = 0.05


@dataclass(frozen=True)
class PoolSizing:
    """One sizing decision: its inputs (bytes) and the slots it gives."""

    free_bytes: int  # free device memory after the weights (and the profile) loaded
    activation_bytes: int  # peak of the largest forward step, logits and sampling
    graph_bytes: int  # reserved for CUDA graphs (0 when none are captured)
    mem_fraction: float
    bytes_per_slot: int  # K and V of one token over every layer
    page_size: int
    num_slots: int  # including the reserved padding page
    graph_batch_size: int = 0  # the largest decode graph graph_bytes was reserved for

    @property
    def pool_bytes(self) -> int:
        return self.num_slots * self.bytes_per_slot

    @property
    def num_tokens(self) -> int:
        """Usable tokens (the reserved page excluded)."""
        return self.num_slots - self.page_size

    def describe(self) -> str:
        left = self.free_bytes - self.activation_bytes - self.graph_bytes
        return (
            f"KV pool auto-sized: {self.free_bytes / GIB:.2f} GiB free after the weights - "
            f"{self.activation_bytes / GIB:.2f} GiB activations (profile forward) - "
            f"{self.graph_bytes / GIB:.2f} GiB CUDA graphs (batches to {self.graph_batch_size}) "
            f"= {left / GIB:.2f} GiB; "
            f"mem_fraction {self.mem_fraction} of it -> {self.pool_bytes / GIB:.2f} GiB = "
            f"{self.num_tokens} tokens at {self.bytes_per_slot} bytes per token"
        )


def size_pool(
    *,
    free_bytes: int,
    activation_bytes: int,
    graph_bytes: int,
    bytes_per_slot: int,
    mem_fraction: float,
    page_size: int,
    graph_batch_size: int = 0,
) -> PoolSizing:
    """Slots = mem_fraction * (free - activations - graphs) / bytes_per_slot, whole pages,
    at most MAX_AUTO_SLOTS.

    Raises MemoryError when that leaves less than two pages (the reserved one and one
    usable): the model does not fit with room for any KV cache.
    """
    if bytes_per_slot <= 0:
        raise ValueError(f"bytes_per_slot: must be > 0, got {bytes_per_slot}")
    left = free_bytes - activation_bytes - graph_bytes
    slots = min(max(int(mem_fraction * left), 0) // bytes_per_slot, MAX_AUTO_SLOTS)
    slots -= slots % page_size
    if slots < 2 * page_size:
        raise MemoryError(
            f"no device memory left for the KV cache: {free_bytes} bytes free after the "
            f"weights, {activation_bytes} for activations, {graph_bytes} for CUDA graphs "
            f"({bytes_per_slot} bytes per token); use a smaller max_num_batched_tokens or "
            "max_running_requests, or set kv_cache_tokens"
        )
    return PoolSizing(
        free_bytes=free_bytes,
        activation_bytes=activation_bytes,
        graph_bytes=graph_bytes,
        mem_fraction=mem_fraction,
        bytes_per_slot=bytes_per_slot,
        page_size=page_size,
        num_slots=slots,
        graph_batch_size=graph_batch_size,
    )


def graph_reserve_bytes(
    activation_bytes: int, profile_tokens: int, graph_batch_size: int, workspace_bytes: int
) -> int:
    """CUDA graph memory: the profile's activations scaled to the largest graph batch
    (the graphs share one private pool, sized by the largest) plus the decode workspaces
    that each graph keeps for itself. An overestimate: the profile's peak includes logits
    and sampling, which graphs do not capture."""
    if graph_batch_size <= 0:
        return 0
    share = min(graph_batch_size, profile_tokens) / profile_tokens
    return int(activation_bytes * share) + workspace_bytes


def decode_workspace_bytes(
    ladder: list[int], num_splits: Callable[[int], int], num_heads: int, head_dim: int
) -> int:
    """Float32 partial outputs and log-sum-exps ([B, Hq, S, D + 1]) of every graph's
    decode workspace; `num_splits(B)` is the split count the graph of batch B uses."""
    return sum(4 * bs * num_heads * num_splits(bs) * (head_dim + 1) for bs in ladder)


def shared_graph_workspace_bytes(graph_batch_size: int, num_heads: int, head_dim: int) -> int:
    """The workspace the triton backend's shared-prefix graphs share ([B, Hq, S, D + 1]
    float32 at the largest graph's B, S their prefix and own splits; the fused kernel's
    graphs need none, this counts the larger). Their activations come from the graphs'
    one private pool, which the flat graphs already size."""
    from radixmesh.worker.attention.triton_backend import GRAPH_OWN_SPLITS, GRAPH_PREFIX_SPLITS

    splits = GRAPH_PREFIX_SPLITS + GRAPH_OWN_SPLITS
    return 4 * graph_batch_size * num_heads * splits * (head_dim + 1)


def _shared_prefix_graphs(config: EngineConfig) -> bool:
    """Whether the triton backend will capture shared-prefix graphs (worker.build_runner:
    the option or its env var, one rank)."""
    from radixmesh.worker.attention.triton_backend import shared_prefix_requested

    return shared_prefix_requested(config.model.shared_prefix_decode) and (
        config.parallel.tp_size == 1
    )


def flashinfer_reserve_bytes(graph_batch_size: int, max_context_len: int) -> int:
    """What the flashinfer backend allocates beside the pool: its float workspace and,
    with graphs, each ladder size's wrapper (FlashInfer's 8 MiB int workspace) and the
    index buffer they share (int32, at most every row at full context)."""
    from radixmesh.worker.attention.flashinfer_backend import (
        INT_WORKSPACE_BYTES,
        WORKSPACE_BYTES,
    )
    from radixmesh.worker.cuda_graph import batch_size_ladder

    if graph_batch_size <= 0:
        return WORKSPACE_BYTES + 2 * INT_WORKSPACE_BYTES
    wrappers = len(batch_size_ladder(graph_batch_size)) + 2
    return WORKSPACE_BYTES + wrappers * INT_WORKSPACE_BYTES + 4 * graph_batch_size * max_context_len


def profile_lengths(num_tokens: int, max_len: int) -> list[int]:
    """Sequence lengths of the profile batch: `num_tokens` in all, none over `max_len`."""
    full, rest = divmod(num_tokens, max_len)
    return [max_len] * full + ([rest] if rest else [])


class ProfileStep:
    """The largest step the scheduler can build, on a throwaway pool: one prefill of
    `num_tokens` tokens (sequences of at most `max_seq_len`), then logits and top-p
    sampling for `num_sample_rows` rows. Build it first, then measure `run`: the pool and
    inputs are not part of the step's peak."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        attention_backend: str,
        *,
        num_tokens: int,
        max_seq_len: int,
        num_layers: int,
        head_dim: int,
        dtype: torch.dtype,  # of the KV pool
        device: torch.device,
    ) -> None:
        self.model = model
        lengths = profile_lengths(num_tokens, max_seq_len)
        self.pool = KVPool(
            num_slots=num_tokens + 1,  # + the reserved padding slot 0
            num_layers=num_layers,
            num_kv_heads=model.num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            device=device,
        )
        self.attn = create_attention_backend(
            attention_backend, self.pool, model.arch.attention_scale
        )
        # [B, max len]: sequence b's tokens in consecutive slots after the padding slot
        table = torch.zeros((len(lengths), max(lengths)), dtype=torch.int64)
        start = 1
        for row, n in enumerate(lengths):
            table[row, :n] = torch.arange(start, start + n)
            start += n
        self.batch = ForwardBatch.build(
            input_ids=[0] * num_tokens,
            out_cache_loc=torch.arange(1, num_tokens + 1),
            req_rows=list(range(len(lengths))),
            prefix_lens=[0] * len(lengths),
            extend_lens=lengths,
            req_to_token=table.to(device),
        )

    @torch.inference_mode()
    def run(self, num_sample_rows: int, vocab_size: int) -> list[int]:
        """The forward, logits and sampling; returns the sampled ids."""
        self.attn.prepare(self.batch)
        hidden = self.model(self.batch, self.attn)  # [T, hidden]
        rows = min(num_sample_rows, hidden.shape[0])
        logits = self.model.compute_logits(hidden[:rows])  # [R, V] float32
        params = SamplingParams(temperature=1.0, top_p=0.9)
        sample_rows = [SamplingRow(params=params, prompt_ids=(), output_ids=())] * rows
        return Sampler(vocab_size).sample(logits, sample_rows).token_ids


def profile_peak_bytes(run: Callable[[], object], device: torch.device) -> int:
    """Peak CUDA memory that `run()` allocates beyond what was allocated before it."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    run()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - before)


def graph_max_batch_size(config: EngineConfig) -> int:
    """The largest decode CUDA graph: one row per running request; with jump-forward
    decode rows (GrammarConfig) room for their forced tokens too, and with graphed
    prefill (ModelConfig.cuda_graph_prefill_reads) room for one prompt that fits its
    read budget (n tokens from scratch read n (n + 1) / 2 keys)."""
    rows = config.scheduler.running_cap
    if config.grammar.jump_forward_decode_rows:
        rows *= 4
    rows += math.isqrt(2 * config.model.cuda_graph_prefill_reads)
    cap = config.model.cuda_graph_max_batch_size
    return min(CUDA_GRAPH_MAX_BATCH_SIZE if cap is None else cap, rows)


def graph_batch_within_budget(
    wanted: int, budget_bytes: int, reserve_bytes: Callable[[int], int]
) -> int:
    """The largest size of `wanted`'s graph ladder whose reserve (`reserve_bytes(size)`,
    growing with the size) is at most `budget_bytes`; 0 (no graphs) when none is."""
    if wanted <= 0:
        return 0
    from radixmesh.worker.cuda_graph import batch_size_ladder

    for size in reversed(batch_size_ladder(wanted)):
        if reserve_bytes(size) <= budget_bytes:
            return size
    return 0


def fit_batches_to_pool(
    config: EngineConfig, pool_tokens: int, *, auto_running: bool, graph_limit: int
) -> EngineConfig:
    """On CUDA, once the pool is sized: `config` with an auto running cap fitted to the
    pool's tokens (`fit_running_to_pool`) and an auto graph size (cuda_graph_max_batch_size
    None) resolved to what that cap can use (`graph_max_batch_size`), at most
    `graph_limit` (the size the pool sizing reserved memory for). Sizes the caller gave
    are kept."""
    sc = config.scheduler
    if auto_running:
        sc = fit_running_to_pool(sc, pool_tokens)
    config = dataclasses.replace(config, scheduler=sc)
    mc = config.model
    if mc.cuda_graph_max_batch_size is None:
        graphs = min(graph_max_batch_size(config), graph_limit)
        config = dataclasses.replace(
            config, model=dataclasses.replace(mc, cuda_graph_max_batch_size=graphs)
        )
    return config


@dataclass(frozen=True)
class ModelOnDevice:
    """What auto-sizing profiles: the loaded model, its shape and where it runs."""

    model: LlamaForCausalLM
    arch: LlamaArchConfig
    device: torch.device
    dtype: torch.dtype
    kv_dtype: torch.dtype  # the KV pool's storage dtype (the model's, or FP8)
    attention_backend: str  # resolved: "torch", "triton" or "flashinfer"
    num_heads: int  # query heads on this rank


def auto_size_pool(
    m: ModelOnDevice, config: EngineConfig, bytes_per_slot: int, *, auto_running: bool = False
) -> PoolSizing:
    """Profile the largest step, then give the pool mem_fraction of what is left.

    `auto_running`: the running cap was not given; it is first lowered to what the largest
    pool the free memory allows could hold (the profile samples that many rows and the
    graph reserve covers them), and the caller fits it to the pool afterwards
    (`fit_batches_to_pool`, with the PoolSizing's graph_batch_size as the graph limit)."""
    sc = config.scheduler
    free = free_device_bytes(m.device, config.cache.gpu_memory_share)
    if auto_running:
        sc = fit_running_to_pool(sc, free // bytes_per_slot)
        config = dataclasses.replace(config, scheduler=sc)
    limit = config.model.context_length or m.arch.context_limit
    tokens = sc.token_budget
    activation = _profile_activation_bytes(m, config, min(tokens, limit))
    gc.collect()  # nothing of the profile step may outlive it...
    torch.cuda.empty_cache()  # ...and its pool and activations go back to the device
    reserve = _graph_reserve(m, config, activation, limit)
    graph_bs = graph_max_batch_size(config)
    if config.model.cuda_graph_max_batch_size is None:
        budget = int(GRAPH_MEMORY_FRACTION * max(free - activation, 0))
        graph_bs = graph_batch_within_budget(graph_bs, budget, reserve)
    return size_pool(
        free_bytes=free_device_bytes(m.device, config.cache.gpu_memory_share),
        activation_bytes=activation,
        graph_bytes=reserve(graph_bs),
        bytes_per_slot=bytes_per_slot,
        mem_fraction=config.cache.mem_fraction,
        page_size=config.cache.page_size,
        graph_batch_size=graph_bs,
    )


def _graph_reserve(
    m: ModelOnDevice, config: EngineConfig, activation: int, max_context_len: int
) -> Callable[[int], int]:
    """Bytes to reserve beside the pool for decode graphs up to a batch size, by backend:
    triton's graphs (`graph_reserve_bytes` with their decode workspaces); flashinfer's
    workspace (allocated after the pool, graphs or not) and, with graphs, a wrapper each;
    nothing for torch, which captures no graphs."""
    tokens = config.scheduler.token_budget

    def triton(bs: int) -> int:
        if bs <= 0:
            return 0
        det = config.model.deterministic
        workspace = _graph_workspace_bytes(m, bs, max_context_len, det)
        if not det and _shared_prefix_graphs(config):  # their one workspace, at the largest
            workspace += shared_graph_workspace_bytes(bs, m.num_heads, m.arch.head_size)
        return graph_reserve_bytes(activation, tokens, bs, workspace)

    def flashinfer(bs: int) -> int:
        graphs = graph_reserve_bytes(activation, tokens, bs, 0) if bs > 0 else 0
        return flashinfer_reserve_bytes(bs, max_context_len) + graphs

    backends = {"triton": triton, "flashinfer": flashinfer}
    return backends.get(m.attention_backend, lambda bs: 0)


def _profile_activation_bytes(m: ModelOnDevice, config: EngineConfig, max_seq_len: int) -> int:
    sc = config.scheduler
    step = ProfileStep(
        m.model,
        m.attention_backend,
        num_tokens=sc.token_budget,
        max_seq_len=max_seq_len,
        num_layers=m.arch.num_hidden_layers,
        head_dim=m.arch.head_size,
        dtype=m.kv_dtype,
        device=m.device,
    )
    return profile_peak_bytes(lambda: step.run(sc.running_cap, m.arch.vocab_size), m.device)


def free_device_bytes(device: torch.device, share: float) -> int:
    """What the device has free, at most what this worker's memory share leaves: its
    share of the whole device less what it holds (the caching allocator's reserve and
    CUDA_CONTEXT_BYTES for the context and library workspaces)."""
    free, total = torch.cuda.mem_get_info(device)
    if share >= 1.0:
        return int(free)
    held = torch.cuda.memory_reserved(device) + CUDA_CONTEXT_BYTES
    return max(min(int(free), int(share * total) - held), 0)


def _graph_workspace_bytes(
    m: ModelOnDevice, graph_bs: int, max_context_len: int, deterministic: bool
) -> int:
    from radixmesh.worker.attention.triton_backend import choose_num_splits
    from radixmesh.worker.cuda_graph import batch_size_ladder

    sms = torch.cuda.get_device_properties(m.device).multi_processor_count
    kv_heads = m.model.num_kv_heads
    return decode_workspace_bytes(
        batch_size_ladder(graph_bs),
        lambda bs: 1 if deterministic else choose_num_splits(bs, kv_heads, max_context_len, sms),
        num_heads=m.num_heads,
        head_dim=m.arch.head_size,
    )

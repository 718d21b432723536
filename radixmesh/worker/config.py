"""Frozen configuration of one worker, one dataclass per subsystem.

Each subsystem receives the narrowest config it needs. `EngineConfig.from_options`
turns flat keyword options (the CLI's and `Engine(**options)`'s) into the composed
config, rejecting unknown names, so the CLI and the Python API cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.sampling_params import MAX_TOP_LOGPROBS
from radixmesh.worker.constrained.limits import ConstraintLimits

POLICIES = ("lpm", "dfs-weight", "fcfs")
DTYPES = ("auto", "float32", "float16", "bfloat16")
# Weight quantization methods (radixmesh/worker/layers/quantization/); None: the checkpoint's
# own (none, or FP8 for a checkpoint whose config.json has an fp8 quantization_config).
# The fp8 names differ in the scales a full-precision weight gets at load: "fp8" the
# default (one per output channel), or the layout named.
DETERMINISTIC_GEMMS = ("auto", "triton")
QUANTIZATIONS = ("fp8", "fp8-channel", "fp8-1x128", "fp8-128x128")
# KV pool storage: auto = the model dtype; fp8 = float8_e4m3fn with a power-of-two scale
# per token and KV head (radixmesh/worker/kvcache/fp8_kv.py).
KV_CACHE_DTYPES = ("auto", "fp8")
# When the host-memory tier copies a node out of the device (docs/kv-cache.md).
HOST_KV_WRITE_POLICIES = ("write_through", "write_back")
# Where speculative decoding's drafts come from (radixmesh/worker/speculative/).
SPECULATIVE_METHODS = ("off", "ngram", "radix", "draft", "eagle")


@dataclass(frozen=True)
class ModelConfig:
    """The model a worker serves and how it runs it."""

    model: str = "smollm2"
    """smollm2, an HF directory, a .gguf path, a hub id (org/name[@revision]),
    dummy:<preset>."""
    served_model_name: str | None = None
    """The name clients see (ModelInfo, /v1/models, the metrics' model_name); None: `model`."""
    revision: str | None = None
    """Of a hub model: a branch, tag or commit (or model@rev)."""
    download_dir: str | None = None
    """The Hugging Face hub cache to read and download into; None: huggingface_hub's own
    ($HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub)."""
    chat_template: str | None = None
    """A Jinja chat template file that replaces the model's own (on the router too)."""
    dtype: str = "auto"
    """auto: bfloat16 on CUDA, float32 on CPU (see device.resolve_dtype)."""
    device: str = "auto"
    """auto: cuda when available, else cpu."""
    context_length: int | None = None
    """None: the model's own."""
    seed: int = 0
    """For dummy weights and unseeded sampling."""
    pack_cpu_weights: bool = True
    """CPU: repack weights into oneDNN's GEMM layout after loading (see layers/dense.py)."""
    cuda_graph_max_batch_size: int | None = None
    """CUDA (triton or flashinfer attention): capture decode steps as CUDA graphs for
    batches up to this size (capped by what max_running_requests can use); 0 turns graphs
    off. None: sized with the KV pool (pool_sizing.fit_batches_to_pool): what the running
    cap can use, at most CUDA_GRAPH_MAX_BATCH_SIZE, within GRAPH_MEMORY_FRACTION of the
    memory the pool and the graphs share."""
    cuda_graph_prefill_reads: int = 65536
    """With decode CUDA graphs: a step whose prompt chunks are short runs them as decode
    rows (one per token; ModelRunner._decode_shaped) and replays the graph instead of an
    eager step, when the chunks' attention reads, summed over their tokens (each reads
    every key before it), are at most this many keys: 65,536 is one ~360-token prompt
    from scratch or three of ~190. Longer prompts and long cached prefixes keep the extend
    kernel, which reads each key once per tile. 0: prompt chunks always run eagerly."""
    shared_prefix_decode: bool = False
    """Triton attention: decode steps whose rows share cached prefixes (the radix cache's
    sharing, found in the slot table) read each prefix once per chunk of 16 rows, not once
    per row (attention/kernels/decode_shared.py), through a second decode CUDA graph per
    size from 8 rows. Off by default: on an H100 its kernels take 0.40-0.49x the flat
    decode's time over shared 1,536-token prefixes, but the shared-prefix workload's
    throughput moved within its run-to-run spread (docs/performance.md, "Shared-prefix
    decode"). RADIXMESH_SHARED_PREFIX_DECODE=1 turns it on too."""
    warmup: bool | None = None
    """Before the worker reports ready, run dummy requests through its scheduler and model
    runner (prefills at several token counts, one over a cached prefix, a step that mixes
    decoding rows with a prompt, greedy and sampled rows; worker/warmup.py), so that the
    kernels a step can launch are compiled before the first request rather than during
    it. Everything the warm-up took is freed and the radix cache left empty. A worker
    that warms up also waits for the grammar backend's build (`grammar_warmup`).
    None: on CUDA (Triton compiles a kernel at its first launch), off on CPU (nothing to
    compile)."""
    quantization: str | None = None
    """None: the checkpoint's own. "fp8": linear weights (q/k/v/o, gate/up/down) as
    float8_e4m3fn with a float32 scale per output channel, quantized at load ("fp8-1x128":
    one per row and 128 input columns; "fp8-128x128": per 128 x 128 block), and a mixture
    of experts' expert weights (FP8 activations only in large steps); embeddings, LM
    head, routers and norms keep `dtype`. An FP8 checkpoint loads with the scales it
    stores, whatever is named here."""
    deterministic: bool = False
    """Batch-invariant numerics (docs/determinism.md): a request's tokens do not depend on
    what else runs in its step, on cache hits or on chunk boundaries. Fixed-shape GEMMs
    and fixed-order attention on CPU, fixed-tile Triton kernels on CUDA; the scheduler
    aligns cached prefixes and prefill chunks to DETERMINISTIC_BLOCK tokens. Costs speed."""
    deterministic_gemm: str = "auto"
    """Deterministic mode's GEMMs on CUDA. "auto": cuBLAS without a workspace for each
    weight shape whose rows it gives the same bits at every batch size checked at start-up
    (layers/cublas_check.py), the batch-invariant Triton matmul for the others. "triton":
    the Triton matmul for every shape (invariant by construction)."""

    def __post_init__(self) -> None:
        if not self.model:
            raise InvalidArgument("model", "must not be empty")
        if self.cuda_graph_max_batch_size is not None and self.cuda_graph_max_batch_size < 0:
            raise InvalidArgument(
                "cuda_graph_max_batch_size", f"must be >= 0, got {self.cuda_graph_max_batch_size}"
            )
        if self.cuda_graph_prefill_reads < 0:
            raise InvalidArgument(
                "cuda_graph_prefill_reads", f"must be >= 0, got {self.cuda_graph_prefill_reads}"
            )
        if self.dtype not in DTYPES:
            raise InvalidArgument("dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        if self.deterministic_gemm not in DETERMINISTIC_GEMMS:
            raise InvalidArgument(
                "deterministic_gemm",
                f"must be one of {DETERMINISTIC_GEMMS}, got {self.deterministic_gemm!r}",
            )
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise InvalidArgument(
                "quantization", f"must be one of {QUANTIZATIONS} or None, got {self.quantization!r}"
            )
        if self.context_length is not None and self.context_length < 2:
            raise InvalidArgument("context_length", f"must be >= 2, got {self.context_length}")
        for name in ("served_model_name", "revision", "download_dir", "chat_template"):
            if getattr(self, name) == "":
                raise InvalidArgument(name, "must not be empty (None: unset)")
        if self.chat_template is not None and not Path(self.chat_template).is_file():
            raise InvalidArgument("chat_template", f"{self.chat_template} is not a file")


# The KV pool's byte budget on CPU when neither kv_cache_tokens nor kv_cache_bytes is set.
DEFAULT_CPU_KV_CACHE_BYTES = 512 * 1024 * 1024
# The host-memory KV tier's default size on CUDA: this share of the host's memory per GPU
# on the host (times the worker's gpu_memory_share), and at most this many times the
# device pool. All the workers of an 8-GPU node together then pin at most a quarter of
# its memory, leaving the rest to the processes, the page cache and the router; four
# times the pool holds a multi-turn working set well past what the device does.
HOST_KV_RAM_FRACTION = 0.25
HOST_KV_POOL_MULTIPLE = 4


@dataclass(frozen=True)
class CacheConfig:
    """The KV pool and the radix cache over it."""

    page_size: int = 1
    """Tokens per KV page: the pool allocates and the radix cache matches and evicts whole
    pages, so a cached prefix is reused up to its last full page."""
    kv_cache_tokens: int | None = None
    """KV pool size: an explicit token count wins; else a byte budget; else, on CUDA,
    mem_fraction of the device memory that the weights, the activations of the largest
    step and the CUDA graphs leave (see worker/pool_sizing.py); on CPU 512 MiB."""
    kv_cache_bytes: int | None = None
    """The KV pool's byte budget when kv_cache_tokens is not set (see kv_cache_tokens)."""
    mem_fraction: float = 0.9
    """On CUDA, the share of the memory left after weights, activations and graphs that an
    auto-sized KV pool takes (see kv_cache_tokens)."""
    gpu_memory_share: float = 1.0
    """The share of the GPU's memory this worker may take in all (weights, activations,
    graphs, KV pool) when it auto-sizes its pool: `radixmesh launch --workers-per-gpu N`
    gives each of N workers on one GPU 1/N. 1.0: whatever the device has free."""
    disable_radix_cache: bool = False
    """No prefix reuse: nothing is cached past its request, every prompt is prefilled whole."""
    event_block_size: int = 16
    """Cache events report page-aligned blocks of this many tokens (a multiple of page_size)."""
    kv_cache_dtype: str = "auto"
    """KV pool storage: "auto" (the model dtype) or "fp8" (about half the bytes per token)."""
    host_kv_cache_bytes: int | None = None
    """The host-memory KV tier (docs/kv-cache.md): pinned host memory that keeps what the
    device pool evicts, copied back on a hit instead of recomputed. 0: off. None: on CUDA,
    HOST_KV_RAM_FRACTION of the host's memory per GPU on it, times gpu_memory_share, at
    most half of what is available and HOST_KV_POOL_MULTIPLE times the device pool
    (host_tier.default_host_bytes); off on CPU (its "device" pool is host memory already)
    and with tensor parallelism."""
    host_kv_write_policy: str = "write_back"
    """With the host tier: "write_back" copies a node to host memory when the device evicts
    it, on the forwards' stream, between two steps (nothing is copied for what is never
    evicted); "write_through" copies each new node at once, on a stream beside the
    forwards, so that evicting it later costs no copy. write_back measured faster on the
    H200 (docs/performance.md, "The host-memory KV tier")."""

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidArgument(
                "kv_cache_dtype", f"must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}"
            )
        if self.page_size < 1:
            raise InvalidArgument("page_size", f"must be >= 1, got {self.page_size}")
        if self.kv_cache_tokens is not None and self.kv_cache_tokens < self.page_size:
            raise InvalidArgument("kv_cache_tokens", f"must be >= page_size ({self.page_size})")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes <= 0:
            raise InvalidArgument("kv_cache_bytes", f"must be > 0, got {self.kv_cache_bytes}")
        if not 0.0 < self.mem_fraction <= 1.0:
            raise InvalidArgument("mem_fraction", f"must be in (0, 1], got {self.mem_fraction}")
        if not 0.0 < self.gpu_memory_share <= 1.0:
            raise InvalidArgument(
                "gpu_memory_share", f"must be in (0, 1], got {self.gpu_memory_share}"
            )
        if self.host_kv_write_policy not in HOST_KV_WRITE_POLICIES:
            raise InvalidArgument(
                "host_kv_write_policy",
                f"must be one of {HOST_KV_WRITE_POLICIES}, got {self.host_kv_write_policy!r}",
            )
        if self.host_kv_cache_bytes is not None and self.host_kv_cache_bytes < 0:
            raise InvalidArgument(
                "host_kv_cache_bytes", f"must be >= 0, got {self.host_kv_cache_bytes}"
            )
        if self.event_block_size % self.page_size:
            raise InvalidArgument(
                "event_block_size",
                f"{self.event_block_size} is not a multiple of page_size ({self.page_size})",
            )


# Batch sizes when none is given: on CPU, small steps keep latency sane; on CUDA, the
# token budget measured best for an 8B model on an H200 (docs/performance.md: the engine
# with no options against the tuned run), and a running cap and CUDA graphs that follow
# the KV pool (`fit_running_to_pool`, pool_sizing.fit_batches_to_pool).
CPU_MAX_RUNNING_REQUESTS = 64
CPU_MAX_NUM_BATCHED_TOKENS = 2048
CUDA_MAX_NUM_BATCHED_TOKENS = 8192
CUDA_SMALL_GPU_BATCHED_TOKENS = 4096  # GPUs under 40 GiB: less activation memory per step
# An auto running cap on CUDA: one request per this many tokens of the KV pool, within
# [CUDA_MIN_RUNNING_REQUESTS, CUDA_MAX_RUNNING_REQUESTS] (the reasons: fit_running_to_pool).
CUDA_POOL_TOKENS_PER_REQUEST = 1024
CUDA_MIN_RUNNING_REQUESTS = 16
CUDA_MAX_RUNNING_REQUESTS = 1024
# The largest decode CUDA graph an auto cuda_graph_max_batch_size captures: the peer-shape
# runs' best on Llama-3-8B FP8 (1,024 running, graphs to 512; docs/performance.md). Past
# it a decode step of an 8B model is long enough that its kernel launches, which a graph
# saves, are a small part of it, and every 16 rows more is one more graph to capture.
CUDA_GRAPH_MAX_BATCH_SIZE = 512


@dataclass(frozen=True)
class SchedulerConfig:
    """What each step admits and runs."""

    policy: str = "lpm"
    """The order waiting requests are admitted in (worker/policy.py): lpm, longest cached
    prefix first; dfs-weight, a walk of the radix tree, heavier subtrees first; fcfs."""
    max_running_requests: int | None = None
    """None: CPU_MAX_RUNNING_REQUESTS on CPU; on CUDA one per CUDA_POOL_TOKENS_PER_REQUEST
    tokens of the KV pool, between CUDA_MIN_RUNNING_REQUESTS and CUDA_MAX_RUNNING_REQUESTS
    (`fit_running_to_pool`)."""
    max_num_batched_tokens: int | None = None
    """Token budget of one forward step; long prompts are prefilled in chunks of this.
    None: CPU_MAX_NUM_BATCHED_TOKENS on CPU, CUDA_MAX_NUM_BATCHED_TOKENS on CUDA."""
    new_token_ratio: float = 0.4
    """Fraction of each running request's remaining max_new_tokens that admission reserves."""
    policy_fallback_queue_len: int = 128
    """Beyond this many waiting requests, lpm/dfs-weight fall back to fcfs (matching every
    waiting prompt against the tree each step would cost more than it saves)."""
    max_queued_requests: int = 4096
    """Requests held beyond the running ones (worker/admission.py); one more is refused as
    overloaded (RESOURCE_EXHAUSTED), and the router tries another worker."""
    in_batch_prefix_threshold: int = 32
    """A waiting request whose uncached prompt shares at least this many tokens with one
    admitted in the same step waits one step and then hits the cache instead."""
    admission_match_limit: int = 64
    """A step prefix-matches at most this many waiting requests that it then defers (see
    in_batch_prefix_threshold) before it stops looking down the queue: a bound on one
    step's admission time whatever waits (each match walks a prompt through the radix
    tree, ~5-15 us for 1,600 tokens on a 2-core CPU). Requests deferred without a match
    (the same first tokens as a new prefix admitted in the step) do not count."""
    overlap_schedule: bool | None = None
    """Overlap scheduling: build step n+1 (and process step n-1's tokens) while step n runs;
    next-token ids stay on the device until needed (see worker/overlap.py). None: on for
    CUDA, where it won on both offline H200 workloads (docs/overlap.md), off on CPU, where
    the forward is synchronous and there is nothing to overlap with."""
    max_top_logprobs: int = MAX_TOP_LOGPROBS
    """The most top logprobs a request may ask for per token (top_logprobs_num)."""
    gc_freeze: bool = True
    """Freeze the process's objects out of Python's cyclic garbage collector once the
    engine has started (`gc.freeze()`; `shutdown` unfreezes them). A full collection
    otherwise walks every object torch, the model and the tokenizer made, in the middle
    of a scheduler step (0.2 s a collection on the 2-core CPU, every other 1,024-request
    call: docs/performance.md). What the engine frees later is still freed (reference
    counting, and the collector for anything made after); only cycles among objects older
    than the engine wait for its shutdown."""

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise InvalidArgument("policy", f"must be one of {POLICIES}, got {self.policy!r}")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise InvalidArgument("max_running_requests", "must be >= 1")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise InvalidArgument("max_num_batched_tokens", "must be >= 1")
        if not 0.0 <= self.new_token_ratio <= 1.0:
            raise InvalidArgument("new_token_ratio", "must be in [0, 1]")
        if self.in_batch_prefix_threshold < 1:
            raise InvalidArgument("in_batch_prefix_threshold", "must be >= 1")
        if self.admission_match_limit < 1:
            raise InvalidArgument("admission_match_limit", "must be >= 1")
        if self.max_queued_requests < 0:
            raise InvalidArgument("max_queued_requests", "must be >= 0")
        if self.max_top_logprobs < 0:
            raise InvalidArgument("max_top_logprobs", "must be >= 0")

    @property
    def running_cap(self) -> int:
        """max_running_requests, once resolved (`batch_defaults`)."""
        assert self.max_running_requests is not None, "unresolved SchedulerConfig"
        return self.max_running_requests

    @property
    def token_budget(self) -> int:
        """max_num_batched_tokens, once resolved (`batch_defaults`)."""
        assert self.max_num_batched_tokens is not None, "unresolved SchedulerConfig"
        return self.max_num_batched_tokens


def batch_defaults(sc: SchedulerConfig, device_type: str, device_bytes: int = 0) -> SchedulerConfig:
    """The scheduler config with its unset batch sizes and overlap filled in for the device.
    On CUDA the running cap is the largest it may be; `fit_running_to_pool` lowers it to what
    the largest pool the free memory allows could hold before the pool is sized (its profile
    step samples that many rows, its graph reserve covers them), then to the pool's size."""
    cuda = device_type == "cuda"
    running = sc.max_running_requests
    if running is None:
        running = CUDA_MAX_RUNNING_REQUESTS if cuda else CPU_MAX_RUNNING_REQUESTS
    tokens = sc.max_num_batched_tokens
    if tokens is None:
        small = device_bytes < 40 * (1 << 30)
        tokens = (
            (CUDA_SMALL_GPU_BATCHED_TOKENS if small else CUDA_MAX_NUM_BATCHED_TOKENS)
            if cuda
            else CPU_MAX_NUM_BATCHED_TOKENS
        )
    overlap = cuda if sc.overlap_schedule is None else sc.overlap_schedule
    return dataclasses.replace(
        sc, max_running_requests=running, max_num_batched_tokens=tokens, overlap_schedule=overlap
    )


def fit_running_to_pool(resolved: SchedulerConfig, pool_tokens: int) -> SchedulerConfig:
    """An auto running cap on CUDA: as many requests as the KV pool holds at
    CUDA_POOL_TOKENS_PER_REQUEST tokens each, at least CUDA_MIN_RUNNING_REQUESTS and at
    most the cap `batch_defaults` gave (CUDA_MAX_RUNNING_REQUESTS).

    Why from the pool: admission reserves pool room for each request (its prompt and
    new_token_ratio of its remaining outputs), so with long requests the pool, not the cap,
    bounds the batch; the cap binds with short ones, where a larger decode batch reads the
    weights once for more tokens. More running requests than the pool holds at a typical
    length would be retracted, and each one costs a req->token table row, sampling rows
    in the profile step and host work in every step. 1,024 tokens is the middle of the
    workloads measured (P1's 512 + 256, the peer shapes' 128 + 128 to 2,048 + 2,048).
    Llama-3-8B on an H200: 876 with a bf16 pool (897k tokens), 1,024 with FP8 KV (1.78M),
    where the peer-shape runs needed 1,024 set by hand (docs/performance.md)."""
    cap = max(CUDA_MIN_RUNNING_REQUESTS, pool_tokens // CUDA_POOL_TOKENS_PER_REQUEST)
    return dataclasses.replace(resolved, max_running_requests=min(resolved.running_cap, cap))


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism of one worker."""

    tp_size: int = 1
    """Tensor-parallel ranks of this worker: rank 0 in this process, the rest spawned
    (gloo on CPU, NCCL on CUDA, rank r on cuda:r). See radixmesh/worker/tp/."""
    tp_timeout: float = 120.0
    """Seconds a collective (and start-up) may wait on a silent rank before failing."""
    tp_one_shot_all_reduce: bool = True
    """CUDA: small all-reduces (decode steps) in one kernel over PyTorch symmetric memory
    instead of NCCL (tp/one_shot.py); falls back to NCCL where it is unavailable."""

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise InvalidArgument("tp_size", f"must be >= 1, got {self.tp_size}")
        if not self.tp_timeout > 0:
            raise InvalidArgument("tp_timeout", f"must be > 0, got {self.tp_timeout}")


GRAMMAR_BACKENDS = ("xgrammar", "outlines")


@dataclass(frozen=True)
class GrammarConfig:
    """Constrained decoding (regex / json_schema / ebnf / choices)."""

    grammar_backend: str = "xgrammar"
    """The library that compiles constraints and masks tokens: xgrammar or outlines."""
    disable_jump_forward: bool = False
    """Ablation switch: sample forced strings token by token instead of appending them."""
    jump_forward_decode_rows: bool = True
    """With decode CUDA graphs: a step whose multi-token rows are all forced output tokens
    runs as one decode row per token, so the graph replays it instead of an eager mixed
    step; the graphs then go up to min(cuda_graph_max_batch_size, 4 x
    max_running_requests) rows (the running rows plus their forced tokens)."""
    grammar_compile_processes: int = 2
    """Compiles run in this many processes (worker/constrained/compile_pool.py); a compile
    running longer than the timeout (seconds) is stopped and its request rejected
    (InvalidArgument), as is one whose process grows by more than the memory bytes.
    0 processes: compile on a thread of the engine's process, with no limit."""
    grammar_compile_timeout: float = 10.0
    """Seconds a compile may run before it is stopped (see grammar_compile_processes)."""
    grammar_compile_memory_bytes: int = 1 << 30
    """Bytes a compile's process may grow by before it is stopped (see
    grammar_compile_processes)."""
    grammar_max_costly_compiles: int = 4
    """Compiles estimated costly (worker/constrained/cost.py) run on all but one of the
    processes, and at most this many run or wait; one more is refused with
    RESOURCE_EXHAUSTED (overloaded, retry after the compile timeout)."""
    grammar_max_bytes: int = 128 * 1024
    """Bounds checked before a compile (InvalidArgument past one): a constraint's UTF-8
    bytes, its nesting (JSON containers, regex / EBNF groups), its repetition counts
    (`{n,m}`, a schema's min/max length, items, properties). This one: the UTF-8 bytes."""
    grammar_max_depth: int = 128
    """The deepest nesting a constraint may have (see grammar_max_bytes)."""
    grammar_max_repetition: int = 10_000
    """The largest repetition count a constraint may name (see grammar_max_bytes)."""
    grammar_max_compiled_bytes: int = 32 << 20
    """A compiled grammar's serialized size, estimated before the compile (numeric ranges,
    unrolled items: InvalidArgument at once) and measured before it is serialized."""
    grammar_warmup: bool = True
    """Build the backend (xgrammar's tokenizer info, ~0.5 s on CPU) on a background thread
    from engine start, so the first constrained request does not wait for it. With the
    model's warm-up on (`ModelConfig.warmup`, CUDA's default) the worker waits for the build
    before it reports ready (left running it shares the GIL with the first batch); without
    it the build goes on beside the first requests. False builds it on first use."""

    def __post_init__(self) -> None:
        if self.grammar_backend not in GRAMMAR_BACKENDS:
            raise InvalidArgument(
                "grammar_backend",
                f"must be one of {GRAMMAR_BACKENDS}, got {self.grammar_backend!r}",
            )
        if not self.grammar_compile_timeout > 0:
            raise InvalidArgument("grammar_compile_timeout", "must be > 0")
        if self.grammar_compile_processes < 0:
            raise InvalidArgument("grammar_compile_processes", "must be >= 0")
        for name in (
            "grammar_compile_memory_bytes",
            "grammar_max_costly_compiles",
            "grammar_max_bytes",
            "grammar_max_depth",
            "grammar_max_repetition",
            "grammar_max_compiled_bytes",
        ):
            if getattr(self, name) < 1:
                raise InvalidArgument(name, f"must be >= 1, got {getattr(self, name)}")

    @property
    def limits(self) -> ConstraintLimits:
        return ConstraintLimits(
            self.grammar_max_bytes,
            self.grammar_max_depth,
            self.grammar_max_repetition,
            self.grammar_max_compiled_bytes,
        )


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (worker/speculative/): a decoding request's step verifies
    drafted tokens with its next one, in one forward, and keeps those the model agrees
    with (exactly what decoding them one by one gives; docs/speculative.md)."""

    speculative: str = "off"
    """Where drafts come from: off; ngram (the request's own prompt and output: the text
    after the latest earlier occurrence of its last few tokens); radix (the radix tree:
    what earlier requests generated after the same text, else ngram); draft (a smaller
    model with the same tokenizer, `speculative_draft_model`, run beside the target);
    eagle (an EAGLE head over the target's own features, `speculative_draft_model`).
    `draft:<model>` and `eagle:<dir>` say both at once (`--speculative draft:<model>`)."""
    speculative_tokens: int = 4
    """Draft tokens a request verifies per step (k; the step computes 1 + k tokens)."""
    speculative_max_batch_size: int = 16
    """No step drafts while more requests than this run: a large batch is bound by
    compute, where verifying rejected drafts costs what it saves (and steps that draft
    read their tokens back at once, so they do not overlap the next step's host work)."""
    speculative_ngram_max: int = 4
    """The longest suffix the ngram drafter looks up (it tries the longest first)."""
    speculative_ngram_min: int = 2
    """The shortest suffix the ngram drafter looks up."""
    speculative_draft_model: str | None = None
    """The draft model for speculative='draft' (a name or path as for `model`): its
    vocabulary must be the target's. It runs on the same device with a KV pool of its own.
    For speculative='eagle': the EAGLE head's directory (config.json, *.safetensors)."""
    speculative_draft_kv_tokens: int = 65536
    """KV slots of the draft model's pool (its radix cache keeps each request's sequence
    between steps, so a step computes only the tokens added since the last)."""
    speculative_min_accept_rate: float = 0.25
    """A request whose drafts are accepted at less than this rate (accepted per drafted
    token, a moving average) stops drafting for a while, longer each time."""

    def __post_init__(self) -> None:
        method, sep, model = self.speculative.partition(":")
        if sep and method in ("draft", "eagle"):  # the method and its model in one option
            if not model:
                raise InvalidArgument("speculative", f"{self.speculative!r} names no model")
            given = self.speculative_draft_model
            if given is not None and given != model:
                raise InvalidArgument(
                    "speculative_draft_model",
                    f"{given!r} differs from the model in speculative={self.speculative!r}",
                )
            object.__setattr__(self, "speculative", method)
            object.__setattr__(self, "speculative_draft_model", model)
        if self.speculative not in SPECULATIVE_METHODS:
            raise InvalidArgument(
                "speculative",
                f"must be one of {SPECULATIVE_METHODS} (draft:<model>, eagle:<dir>), "
                f"got {self.speculative!r}",
            )
        if not 1 <= self.speculative_tokens <= 16:
            raise InvalidArgument("speculative_tokens", "must be in [1, 16]")
        if self.speculative_max_batch_size < 1:
            raise InvalidArgument("speculative_max_batch_size", "must be >= 1")
        if not 1 <= self.speculative_ngram_min <= self.speculative_ngram_max:
            raise InvalidArgument(
                "speculative_ngram_min", "must be >= 1 and <= speculative_ngram_max"
            )
        if self.speculative in ("draft", "eagle") and not self.speculative_draft_model:
            raise InvalidArgument(
                "speculative_draft_model", f"needed with speculative={self.speculative!r}"
            )
        if self.speculative_draft_kv_tokens < 64:
            raise InvalidArgument("speculative_draft_kv_tokens", "must be >= 64")
        if not 0.0 <= self.speculative_min_accept_rate <= 1.0:
            raise InvalidArgument("speculative_min_accept_rate", "must be in [0, 1]")

    @property
    def enabled(self) -> bool:
        return self.speculative != "off"


@dataclass(frozen=True)
class EngineConfig:
    """One worker's whole config: a part per subsystem, and the attention backend."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    grammar: GrammarConfig = field(default_factory=GrammarConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    attention_backend: str = "auto"
    """auto (triton on CUDA when importable, else torch), triton, torch, or flashinfer
    (FlashInfer's kernels: `radixmesh[flashinfer]`, CUDA; where it cannot run, the
    device's default, said once in the log: attention/selection.py)."""

    @classmethod
    def from_options(cls, **options: Any) -> EngineConfig:
        """Flat options (`model=`, `page_size=`, `policy=`, ...) -> the composed config."""
        parts: dict[str, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        owners = _field_owners()
        for name, value in options.items():
            if name in ("attention_backend",):
                top[name] = value
            elif name in owners:
                parts.setdefault(owners[name], {})[name] = value
            else:
                raise InvalidArgument(name, f"unknown engine option {name!r}")
        return cls(
            model=ModelConfig(**parts.get("model", {})),
            cache=CacheConfig(**parts.get("cache", {})),
            scheduler=SchedulerConfig(**parts.get("scheduler", {})),
            parallel=ParallelConfig(**parts.get("parallel", {})),
            grammar=GrammarConfig(**parts.get("grammar", {})),
            speculative=SpeculativeConfig(**parts.get("speculative", {})),
            **top,
        )


# The parts whose fields are the flat options, by EngineConfig's field of each. Each field
# says itself in an attribute docstring, which the CLI shows as the flag's help.
OPTION_CLASSES: dict[str, type] = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "parallel": ParallelConfig,
    "grammar": GrammarConfig,
    "speculative": SpeculativeConfig,
}


def _field_owners() -> dict[str, str]:
    owners: dict[str, str] = {}
    for part, typ in OPTION_CLASSES.items():
        for f in dataclasses.fields(typ):
            owners[f.name] = part
    return owners


def option_fields() -> list[tuple[str, dataclasses.Field[Any]]]:
    """Every flat option with its dataclass field, for generating the CLI."""
    out: list[tuple[str, dataclasses.Field[Any]]] = []
    for typ in OPTION_CLASSES.values():
        out.extend((f.name, f) for f in dataclasses.fields(typ))
    return out

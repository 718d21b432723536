"""One worker's parts, built from an `EngineConfig` and wired together.

Order matters for memory: the model's weights load first, then the KV pool takes its
budget, then the req->token table sized by the context length and max running requests.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import importlib.util
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from radixmesh.errors import InvalidArgument
from radixmesh.sampling_params import SamplingParams
from radixmesh.tokenizer import Tokenizer
from radixmesh.worker.attention.base import AttentionBackend
from radixmesh.worker.attention.registry import create_attention_backend
from radixmesh.worker.config import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    EngineConfig,
    batch_defaults,
    fit_running_to_pool,
)
from radixmesh.worker.constrained.manager import GrammarManager
from radixmesh.worker.kvcache.allocator import KVAllocator
from radixmesh.worker.kvcache.pool import KVPool
from radixmesh.worker.kvcache.radix_cache import RadixCache
from radixmesh.worker.kvcache.req_table import ReqToTokenTable
from radixmesh.worker.layers.dense import pack_model_for_cpu
from radixmesh.worker.layers.parallel import SINGLE, TPGroup
from radixmesh.worker.model.llama import LlamaForCausalLM
from radixmesh.worker.model.loader import (
    iter_weights,
    load_arch_config,
    load_tokenizer,
    locate_model,
)
from radixmesh.worker.model_runner import ModelRunner
from radixmesh.worker.output import OutputProcessor
from radixmesh.worker.pool_sizing import (
    PoolSizing,
    ProfileStep,
    decode_workspace_bytes,
    graph_reserve_bytes,
    profile_peak_bytes,
    size_pool,
)
from radixmesh.worker.scheduler import Scheduler
from radixmesh.worker.tp.followers import FollowerRanks
from radixmesh.worker.tp.group import rank_device
from radixmesh.worker.tp.one_shot import try_one_shot

if TYPE_CHECKING:  # imports triton
    from radixmesh.worker.cuda_graph import DecodeCudaGraphs

logger = logging.getLogger(__name__)


def keep_freed_memory_in_process() -> None:
    """Stop glibc from returning large freed blocks to the OS after every step.

    Each step allocates the same large temporaries (activations, logits). By default
    glibc serves blocks over 128 KiB with mmap and unmaps them on free, so every step
    page-faults them in again: measured ~87k faults and ~170 ms of a 900 ms prefill on
    CPU. Raising the mmap threshold to its maximum (32 MiB) and the trim threshold keeps
    them in the heap. No-op where glibc's mallopt is missing.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
        libc.mallopt(m_trim_threshold, 1024 * 1024 * 1024)
    except (OSError, AttributeError):
        pass


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto`: bf16 on CUDA, float32 on CPU.

    On CPU, bf16 would be faster where the CPU multiplies bf16 natively (about 1.4x end to
    end on the Zen 4 test machine) but its logits are coarse (a bf16 step is 0.06-0.125 at
    logit magnitudes 8-32), so a cache hit, which recomputes only the last prompt token in
    a different batch shape, can flip a near-tie and change a greedy answer. float32 keeps
    the radix cache exact: cache on or off, the same greedy tokens. Ask for
    dtype="bfloat16" to trade that for speed.
    """
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def default_attention_backend(device: torch.device) -> str:
    """Triton kernels on CUDA when triton is installed; the torch reference otherwise."""
    if device.type == "cuda" and importlib.util.find_spec("triton") is not None:
        return "triton"
    return "torch"


# Device memory a worker's process holds outside PyTorch's caching allocator: the CUDA
# context, cuBLAS / Triton workspaces (about 0.5-0.8 GiB seen with torch 2.11 on an H200).
CUDA_CONTEXT_BYTES = 1 << 30


class Worker:
    def __init__(self, config: EngineConfig, tp: TPGroup | None = None) -> None:
        """`tp`: given on ranks 1..N-1 of a TP group (tp/follower.py); rank 0 passes
        None and, when tp_size > 1, spawns and joins the other ranks itself."""
        self.followers: FollowerRanks | None = None
        try:
            self._build(config, tp)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the other TP ranks (if any), leave the process group and stop the grammar
        compile processes."""
        if self.followers is not None:
            self.followers.stop()
        grammars: GrammarManager | None = getattr(self, "grammars", None)
        if grammars is not None:
            grammars.shutdown()

    def _build(self, config: EngineConfig, tp: TPGroup | None) -> None:
        mc, cc = config.model, config.cache
        # A hub id becomes its snapshot directory here, once (downloaded if need be); the
        # router loads the tokenizer of the same commit (`tokenizer_spec`).
        files, self.tokenizer_spec = locate_model(mc)
        self.device = resolve_device(mc.device)
        if config.parallel.tp_size > 1:
            self.device = rank_device(self.device, tp.rank if tp else 0)
            if tp is None:  # rank 0: start the others; they build this same Worker
                model = dataclasses.replace(mc, model=files, revision=None)
                self.followers = FollowerRanks(
                    dataclasses.replace(config, model=model), self.device
                )
                tp = self.followers.tp
        auto_running = config.scheduler.max_running_requests is None
        self.config = config = self._with_batch_defaults(config)
        self.tp = tp or SINGLE
        self.dtype = resolve_dtype(mc.dtype, self.device)
        if self.tp.size > 1 and config.parallel.tp_one_shot_all_reduce:
            fast = try_one_shot(self.device, self.dtype)  # every rank, here: a collective
            if fast is not None:
                self.tp = dataclasses.replace(self.tp, fast_all_reduce=fast)
        if self.device.type == "cpu":
            keep_freed_memory_in_process()
        t0 = time.perf_counter()
        self.arch = load_arch_config(files)
        torch.manual_seed(mc.seed)
        self.model = LlamaForCausalLM(self.arch, tp=self.tp, dtype=self.dtype, device=self.device)
        weights = iter_weights(
            files,
            self.arch,
            dtype=self.dtype,
            device=self.device,
            seed=mc.seed,
            sliced=self.tp.size > 1,  # each rank reads only its slices
        )
        self.model.load_weights(
            tqdm(weights, desc="loading weights", unit=" tensors", disable=self.tp.rank != 0)
        )
        self.model.eval()
        if self.device.type == "cpu" and mc.pack_cpu_weights:
            pack_model_for_cpu(self.model)
        # After the weights: a first GGUF load converts once and caches the tokenizer too.
        self.tokenizer = load_tokenizer(files)
        if mc.chat_template is not None:
            template = Path(mc.chat_template).read_text()
            if not isinstance(self.tokenizer, Tokenizer):
                raise InvalidArgument("chat_template", "dummy models use the built-in template")
            self.tokenizer.set_chat_template(template, source=mc.chat_template)
        self.load_seconds = time.perf_counter() - t0
        self.pool_sizing: PoolSizing | None = None  # set when the pool was auto-sized
        self.graph_memory_bytes = 0  # device memory the CUDA graphs took (measured)
        self.kv_pool = self._build_pool()
        if auto_running and self.device.type == "cuda":
            sc = fit_running_to_pool(config.scheduler, self.kv_pool.num_slots)
            self.config = config = dataclasses.replace(config, scheduler=sc)
        self.allocator = KVAllocator(self.kv_pool.num_slots, cc.page_size, device=self.device)
        self.context_len = self._context_len()
        sc = config.scheduler
        self.req_table = ReqToTokenTable(sc.running_cap, self.context_len, self.device)
        self.cache = RadixCache(
            self.allocator,
            cc.page_size,
            disable=cc.disable_radix_cache,
            event_block_size=cc.event_block_size,
        )
        backend = config.attention_backend
        if backend == "auto":
            backend = default_attention_backend(self.device)
        attn = create_attention_backend(backend, self.kv_pool, self.arch.head_size**-0.5)
        gc = config.grammar
        self.grammars = GrammarManager(
            self.tokenizer,
            self.arch.vocab_size,
            frozenset(self.tokenizer.eos_token_ids) | frozenset(self.arch.eos_token_ids),
            backend=gc.grammar_backend,
            jump_forward=not gc.disable_jump_forward,
            compile_timeout=gc.grammar_compile_timeout,
            compile_processes=gc.grammar_compile_processes,
            compile_memory_bytes=gc.grammar_compile_memory_bytes,
            limits=gc.limits,
        )
        self.runner = ModelRunner(
            self.model,
            attn,
            self.req_table,
            self.arch.vocab_size,
            grammars=self.grammars,
            followers=self.followers,
        )
        if self.device.type == "cuda" and backend == "triton" and mc.cuda_graph_max_batch_size:
            self.runner.decode_graphs = self._capture_decode_graphs(attn)
            # Forced tokens and short prompt chunks replay the graphs too, as decode rows.
            self.runner.decode_shaped_forced = gc.jump_forward_decode_rows
            self.runner.decode_shaped_prompt_reads = mc.cuda_graph_prefill_reads
            if gc.jump_forward_decode_rows or mc.cuda_graph_prefill_reads:
                self.runner.decode_shaped_max_rows = self.runner.decode_graphs.ladder[-1]
        self.scheduler = Scheduler(
            sc,
            cache=self.cache,
            allocator=self.allocator,
            req_table=self.req_table,
            runner=self.runner,
            output=OutputProcessor(self.context_len),
            page_size=cc.page_size,
            grammars=self.grammars,
        )
        self.eos_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(self.arch.eos_token_ids)
        if self.followers is not None:
            self.followers.wait_ready()
        if gc.grammar_warmup and self.tp.rank == 0:  # other ranks get their masks from rank 0
            self.grammars.warmup()  # in the background: the first constrained request waits less

    def _with_batch_defaults(self, config: EngineConfig) -> EngineConfig:
        """`config` with the scheduler's unset batch sizes filled in for this device."""
        memory = 0
        if self.device.type == "cuda":
            memory = torch.cuda.get_device_properties(self.device).total_memory
        sc = batch_defaults(config.scheduler, self.device.type, memory)
        return dataclasses.replace(config, scheduler=sc)

    def _graph_max_batch_size(self) -> int:
        """The largest decode CUDA graph: one row per running request; with jump-forward
        decode rows (GrammarConfig) room for their forced tokens too, and with graphed
        prefill (ModelConfig.cuda_graph_prefill_reads) room for one prompt that fits its
        read budget (n tokens from scratch read n (n + 1) / 2 keys)."""
        rows = self.config.scheduler.running_cap
        if self.config.grammar.jump_forward_decode_rows:
            rows *= 4
        rows += math.isqrt(2 * self.config.model.cuda_graph_prefill_reads)
        return min(self.config.model.cuda_graph_max_batch_size, rows)

    def _capture_decode_graphs(self, attn: AttentionBackend) -> DecodeCudaGraphs:
        from radixmesh.worker.attention.triton_backend import TritonAttentionBackend
        from radixmesh.worker.cuda_graph import DecodeCudaGraphs

        assert isinstance(attn, TritonAttentionBackend), type(attn)
        t0 = time.perf_counter()
        free_before, _ = torch.cuda.mem_get_info(self.device)
        graphs = DecodeCudaGraphs(
            self.model,
            attn,
            self.req_table.table,
            max_batch_size=self._graph_max_batch_size(),
            num_heads=self.arch.num_attention_heads // self.config.parallel.tp_size,
            max_context_len=self.context_len,
        )
        self.graph_memory_bytes = free_before - torch.cuda.mem_get_info(self.device)[0]
        logger.info(
            "captured decode CUDA graphs for batch sizes %s in %.1f s, %.2f GiB",
            graphs.ladder,
            time.perf_counter() - t0,
            self.graph_memory_bytes / (1 << 30),
        )
        return graphs

    def _build_pool(self) -> KVPool:
        cc, arch = self.config.cache, self.arch
        kv_heads = self.model.num_kv_heads  # this rank's share under TP
        per_slot = KVPool.bytes_per_slot(
            arch.num_hidden_layers, kv_heads, arch.head_size, self.dtype
        )
        if cc.kv_cache_tokens is not None:
            slots = cc.kv_cache_tokens + cc.page_size  # + the reserved page
        elif cc.kv_cache_bytes is None and self.device.type == "cuda":
            self.pool_sizing = self._auto_size_pool(per_slot)
            logger.info(self.pool_sizing.describe())
            slots = self.pool_sizing.num_slots
        else:
            slots = (cc.kv_cache_bytes or DEFAULT_CPU_KV_CACHE_BYTES) // per_slot
        slots = self.tp.min_over_ranks(slots, self.device)  # slot ids are shared by all ranks
        slots -= slots % cc.page_size
        return KVPool(
            num_slots=slots,
            num_layers=arch.num_hidden_layers,
            num_kv_heads=kv_heads,
            head_dim=arch.head_size,
            dtype=self.dtype,
            device=self.device,
        )

    def _auto_size_pool(self, bytes_per_slot: int) -> PoolSizing:
        """Profile the largest step, then give the pool mem_fraction of what is left."""
        sc, arch = self.config.scheduler, self.arch
        backend = self.config.attention_backend
        if backend == "auto":
            backend = default_attention_backend(self.device)
        limit = self.config.model.context_length or arch.max_position_embeddings
        tokens = sc.token_budget
        activation = self._profile_activation_bytes(backend, min(tokens, limit))
        gc.collect()  # nothing of the profile step may outlive it...
        torch.cuda.empty_cache()  # ...and its pool and activations go back to the device
        free = self._free_device_bytes()
        graphs = 0
        graph_bs = self._graph_max_batch_size()
        if backend == "triton" and graph_bs > 0:
            graphs = graph_reserve_bytes(
                activation, tokens, graph_bs, self._graph_workspace_bytes(graph_bs, limit)
            )
        return size_pool(
            free_bytes=free,
            activation_bytes=activation,
            graph_bytes=graphs,
            bytes_per_slot=bytes_per_slot,
            mem_fraction=self.config.cache.mem_fraction,
            page_size=self.config.cache.page_size,
        )

    def _free_device_bytes(self) -> int:
        """What the device has free, at most what this worker's memory share leaves: its
        share of the whole device less what it holds (the caching allocator's reserve and
        CUDA_CONTEXT_BYTES for the context and library workspaces)."""
        free, total = torch.cuda.mem_get_info(self.device)
        share = self.config.cache.gpu_memory_share
        if share >= 1.0:
            return int(free)
        held = torch.cuda.memory_reserved(self.device) + CUDA_CONTEXT_BYTES
        return max(min(int(free), int(share * total) - held), 0)

    def _profile_activation_bytes(self, backend: str, max_seq_len: int) -> int:
        sc, arch = self.config.scheduler, self.arch
        step = ProfileStep(
            self.model,
            backend,
            num_tokens=sc.token_budget,
            max_seq_len=max_seq_len,
            num_layers=arch.num_hidden_layers,
            head_dim=arch.head_size,
            dtype=self.dtype,
            device=self.device,
        )
        return profile_peak_bytes(lambda: step.run(sc.running_cap, arch.vocab_size), self.device)

    def _graph_workspace_bytes(self, graph_bs: int, max_context_len: int) -> int:
        from radixmesh.worker.attention.triton_backend import choose_num_splits
        from radixmesh.worker.cuda_graph import batch_size_ladder

        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        kv_heads = self.model.num_kv_heads
        return decode_workspace_bytes(
            batch_size_ladder(graph_bs),
            lambda bs: choose_num_splits(bs, kv_heads, max_context_len, sms),
            num_heads=self.arch.num_attention_heads // self.config.parallel.tp_size,
            head_dim=self.arch.head_size,
        )

    def _context_len(self) -> int:
        limit = self.config.model.context_length or self.arch.max_position_embeddings
        # One request can never hold more than the pool.
        return min(limit, self.allocator.num_usable_slots)

    def stop_ids(self, params: SamplingParams) -> frozenset[int]:
        ids = frozenset(params.stop_token_ids)
        return ids if params.ignore_eos else ids | self.eos_ids

    def validate(self, input_ids: list[int], params: SamplingParams) -> None:
        """Everything the model knows about: raises InvalidArgument naming the field."""
        vocab = self.arch.vocab_size
        for t in input_ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise InvalidArgument(
                    "input_ids", f"token id {t!r} is outside the vocabulary [0, {vocab})"
                )
        params.validate_for(
            prompt_len=len(input_ids),
            context_len=self.context_len,
            vocab_size=vocab,
            max_top_logprobs=self.config.scheduler.max_top_logprobs,
        )

    def flush_cache(self) -> bool:
        if self.scheduler.has_work():
            return False
        self.cache.reset()
        return True

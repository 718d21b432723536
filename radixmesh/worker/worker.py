"""One worker's parts, built from an `EngineConfig` in four phases.

1. `load_model`: the device, the tensor-parallel group (rank 0 spawns the other ranks),
   the weights and the tokenizer.
2. `build_memory`: the KV pool (auto-sized on CUDA from what the weights left), the slot
   allocator, the req->token table and the radix cache.
3. `build_runner`: the attention backend, the grammar manager, the decode CUDA graphs and
   the model runner over them.
4. `build_scheduler`: continuous batching over all of it.

Then, on CUDA, `warm_up` runs dummy requests through all of it (worker/warmup.py), so
that the kernels a step launches are compiled before the first request.

Order matters for memory: the weights load first, then the pool takes its budget, then
the graphs are captured inside what the pool left.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import gc
import logging
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from radixmesh.errors import InvalidArgument
from radixmesh.sampling_params import SamplingParams
from radixmesh.tokenizer import Tokenizer
from radixmesh.worker.attention.base import AttentionBackend
from radixmesh.worker.attention.registry import create_attention_backend
from radixmesh.worker.attention.selection import resolve_attention_backend
from radixmesh.worker.config import (
    CUDA_GRAPH_MAX_BATCH_SIZE,
    DEFAULT_CPU_KV_CACHE_BYTES,
    HOST_KV_POOL_MULTIPLE,
    HOST_KV_RAM_FRACTION,
    EngineConfig,
    batch_defaults,
)
from radixmesh.worker.constrained.announced import AnnouncedGrammars
from radixmesh.worker.constrained.manager import GrammarManager
from radixmesh.worker.deterministic import DETERMINISTIC_BLOCK, make_deterministic
from radixmesh.worker.device import (
    keep_freed_memory_in_process,
    load_cuda_modules_eagerly,
    resolve_device,
    resolve_dtype,
)
from radixmesh.worker.kvcache.allocator import KVAllocator
from radixmesh.worker.kvcache.events import CacheEvent, CacheListener
from radixmesh.worker.kvcache.host_tier import HostTier, default_host_bytes
from radixmesh.worker.kvcache.pool import KVPool, kv_storage_dtype
from radixmesh.worker.kvcache.radix_cache import RadixCache
from radixmesh.worker.kvcache.req_table import ReqToTokenTable
from radixmesh.worker.layers.cublas_check import request_zero_workspace
from radixmesh.worker.layers.dense import pack_model_for_cpu
from radixmesh.worker.layers.parallel import SINGLE, TPGroup
from radixmesh.worker.layers.quantization import dequantize_linears
from radixmesh.worker.model.llama import LlamaForCausalLM
from radixmesh.worker.model.loader import (
    iter_weights,
    load_arch_config,
    load_quantization,
    load_tokenizer,
    locate_model,
)
from radixmesh.worker.model_runner import ModelRunner
from radixmesh.worker.output import OutputProcessor
from radixmesh.worker.pool_sizing import (
    ModelOnDevice,
    PoolSizing,
    auto_size_pool,
    fit_batches_to_pool,
    graph_max_batch_size,
)
from radixmesh.worker.scheduler import Scheduler
from radixmesh.worker.speculative.draft_model import DraftModelDrafter
from radixmesh.worker.speculative.eagle import EagleDrafter
from radixmesh.worker.speculative.eagle_head import EagleHead, load_eagle_head
from radixmesh.worker.speculative.registry import Drafter, create_drafter
from radixmesh.worker.speculative.speculator import Speculator
from radixmesh.worker.tp.follower import run_follower
from radixmesh.worker.tp.group import rank_device
from radixmesh.worker.tp.leader import FollowerRanks
from radixmesh.worker.tp.one_shot import try_one_shot
from radixmesh.worker.warmup import WarmupReport, run_warmup, warmup_plan

if TYPE_CHECKING:  # imports triton
    from radixmesh.worker.cuda_graph import DecodeCudaGraphs

logger = logging.getLogger(__name__)


# What holds device memory, directly or through what it refers to: weights, the KV pool,
# slot tables, CUDA graphs (the runner), requests' tensors (the scheduler).
DEVICE_STATE = (
    "scheduler",
    "runner",
    "cache",
    "host_tier",
    "req_table",
    "allocator",
    "kv_pool",
    "model",
)


class Worker:
    scheduler: Scheduler  # build_scheduler

    def __init__(self, config: EngineConfig, tp: TPGroup | None = None) -> None:
        """`tp`: given on ranks 1..N-1 of a TP group (`follower_main`); rank 0 passes
        None and, when tp_size > 1, spawns and joins the other ranks itself."""
        self.followers: FollowerRanks | None = None
        self.draft: Worker | None = None  # speculative='draft': the draft model's worker
        self.eagle_head: EagleHead | None = None  # speculative='eagle'
        self._check_speculative(config)
        try:
            self.load_model(config, tp)
            if self.tp.rank == 0:  # before the pool is sized from what memory is left
                self.draft = self._build_draft()
                self.eagle_head = self._build_eagle_head()
            self.build_memory()
            self.build_runner()
            # The grammar backend builds in the background from here, beside the rest of
            # the start (rank 0 only: the other ranks get masks).
            grammar_build = config.grammar.grammar_warmup and self.tp.rank == 0
            if grammar_build:
                self.grammars.warmup()
            self.build_scheduler()
            if self.followers is not None:
                self.followers.wait_ready()
            self.warmup: WarmupReport | None = None
            if self.tp.rank == 0:  # the other ranks run its steps as rank 0 sends them
                self.warm_up()
            if grammar_build and self.warmup is not None:
                self._await_grammar_build()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the other TP ranks (if any), leave the process group, stop the grammar
        compile processes, and give back the device memory (`DEVICE_STATE`): a closed
        worker serves nothing, but whoever still holds it (an `Engine` its caller keeps)
        must not keep its weights and KV pool alive, or a second engine in the same
        process runs out of GPU memory."""
        if self.followers is not None:
            self.followers.stop()
        draft: Worker | None = getattr(self, "draft", None)
        if draft is not None:
            draft.close()
        grammars: GrammarManager | None = getattr(self, "grammars", None)
        if grammars is not None:
            grammars.shutdown()
        for name in DEVICE_STATE:
            self.__dict__.pop(name, None)
        gc.collect()  # the runner, the scheduler and the cache refer to one another
        device = getattr(self, "device", None)
        if device is not None and device.type == "cuda":
            torch.cuda.empty_cache()

    # ---- 1. the model -------------------------------------------------------------------

    def load_model(self, config: EngineConfig, tp: TPGroup | None) -> None:
        """Device, TP group, batch defaults, weights and tokenizer."""
        mc = config.model
        # A hub id becomes its snapshot directory here, once (downloaded if need be); the
        # router loads the tokenizer of the same commit (`tokenizer_spec`).
        files, self.tokenizer_spec = locate_model(mc)
        if mc.device == "auto" or mc.device.startswith("cuda"):
            load_cuda_modules_eagerly()  # before anything starts CUDA (device.py)
        self.device = resolve_device(mc.device)
        if mc.deterministic and self.device.type == "cuda":
            request_zero_workspace()  # before any cuBLAS call (layers/cublas_check.py)
        if config.parallel.tp_size > 1:
            self.device = rank_device(self.device, tp.rank if tp else 0)
            if tp is None:  # rank 0: start the others; they build this same Worker
                model = dataclasses.replace(mc, model=files, revision=None)
                ranks_config = dataclasses.replace(config, model=model)
                self.followers = FollowerRanks(ranks_config, self.device, follower_main)
                tp = self.followers.tp
        # On CUDA an unset running cap is fitted to the pool once its size is known.
        self._auto_running = config.scheduler.max_running_requests is None
        self.config = self._with_batch_defaults(config)
        self.dtype = resolve_dtype(mc.dtype, self.device)
        self.tp = self._with_fast_all_reduce(tp or SINGLE)
        if self.device.type == "cpu":
            keep_freed_memory_in_process()
        t0 = time.perf_counter()
        self.arch = load_arch_config(files)
        self._check_context_length(mc.context_length)
        if mc.deterministic and self.arch.num_experts:
            # An expert's matmul takes the rows of every token that picked it in the step,
            # so a token's bits would depend on the rest of the batch.
            raise InvalidArgument("deterministic", "is not supported for mixture-of-experts models")
        self.model = self._load_weights(files)
        # After the weights: a first GGUF load converts once and caches the tokenizer too.
        self.tokenizer = load_tokenizer(files)
        if mc.chat_template is not None:
            template = Path(mc.chat_template).read_text()
            if not isinstance(self.tokenizer, Tokenizer):
                raise InvalidArgument("chat_template", "dummy models use the built-in template")
            self.tokenizer.set_chat_template(template, source=mc.chat_template)
        self.eos_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(self.arch.eos_token_ids)
        self.load_seconds = time.perf_counter() - t0
        if self.tp.rank == 0:  # one line in any log, where the terminal's bar is not drawn
            logger.info("loading weights: %s in %.1f s", mc.model, self.load_seconds)

    def _build_draft(self) -> Worker | None:
        """The draft model's worker (speculative='draft'): same device and dtype, a pool
        of its own, no warm-up; its vocabulary must be the target's. It overlaps its steps
        when the target's scheduler does (on CUDA by default): its k steps a draft run
        back to back, each one's host work under the one before on the device, and none
        past a request's last draft token (`Scheduler._to_run`).

        Decode CUDA graphs for the drafting batch limit's rows of 1 + k tokens: every
        draft-model step after a request's first (the tokens the target kept, up to
        1 + k, then k - 1 decode steps) replays them, as decode rows. Run eagerly, a 1B
        draft model's four steps cost 5.8x a plain step of an 8B target on an H100
        (docs/performance.md, "Speculative decoding"), more than any acceptance can pay
        back. Built before the target sizes its pool, so the graphs' memory comes out of
        what the target then leaves."""
        sp, mc = self.config.speculative, self.config.model
        if sp.speculative != "draft" or sp.speculative_draft_model is None:
            return None
        options = {
            "model": sp.speculative_draft_model,
            "device": str(self.device),
            "dtype": mc.dtype,
            "kv_cache_tokens": sp.speculative_draft_kv_tokens,
            "max_running_requests": sp.speculative_max_batch_size,
            "cuda_graph_max_batch_size": sp.speculative_max_batch_size
            * (1 + sp.speculative_tokens),
            "overlap_schedule": self.config.scheduler.overlap_schedule,
            "warmup": False,
            "grammar_warmup": False,
            "host_kv_cache_bytes": 0,
        }
        draft = Worker(EngineConfig.from_options(**options))
        if draft.arch.vocab_size != self.arch.vocab_size:
            draft.close()
            raise InvalidArgument(
                "speculative_draft_model",
                f"its vocabulary has {draft.arch.vocab_size} tokens, the model's "
                f"{self.arch.vocab_size}: a draft model needs the same tokenizer",
            )
        logger.info("speculative draft model: %s", sp.speculative_draft_model)
        return draft

    def _build_eagle_head(self) -> EagleHead | None:
        """The EAGLE head (speculative='eagle') on the target's device and dtype."""
        sp = self.config.speculative
        if sp.speculative != "eagle" or sp.speculative_draft_model is None:
            return None
        head = load_eagle_head(sp.speculative_draft_model, self.arch, self.dtype, self.device)
        logger.info("speculative EAGLE head: %s", sp.speculative_draft_model)
        return head

    @staticmethod
    def _check_speculative(config: EngineConfig) -> None:
        """Speculative decoding's limits, refused by name at start."""
        if not config.speculative.enabled:
            return
        if config.model.deterministic:
            # A verify row's logits come from an extend-shaped step, a plain decode row's
            # from a decode step: deterministic mode promises the same bits for both.
            raise InvalidArgument(
                "speculative", "is not supported with deterministic mode (use one or the other)"
            )
        if config.cache.page_size != 1:
            raise InvalidArgument(
                "speculative",
                "needs page_size 1 (rejected drafts free single slots), "
                f"got {config.cache.page_size}",
            )
        if config.speculative.speculative == "eagle" and config.parallel.tp_size != 1:
            # The head reads the target's embedding and lm_head, which are sharded then.
            raise InvalidArgument("speculative", "'eagle' needs tp_size 1")

    def _check_context_length(self, context_length: int | None) -> None:
        """InvalidArgument past what the model's positions are defined for; a context
        longer than max_position_embeddings that a rope scaling allows (YaRN) extends the
        rotary tables to it."""
        if not context_length:
            return
        arch = self.arch
        longest, window = arch.longest_context, arch.sliding_window
        if context_length > longest:
            why = (
                f"the model attends over a sliding window of {window} tokens, which is "
                "served only as a context limit"
                if window == longest
                else "the model's positions go no further (a rope_scaling in its config, "
                "e.g. YaRN, can stretch them)"
            )
            raise InvalidArgument("context_length", f"at most {longest}: {why}")
        if context_length > arch.max_position_embeddings:
            self.arch = arch.replace(max_position_embeddings=context_length)

    def _with_batch_defaults(self, config: EngineConfig) -> EngineConfig:
        """`config` with the scheduler's unset batch sizes filled in for this device."""
        memory = 0
        if self.device.type == "cuda":
            memory = torch.cuda.get_device_properties(self.device).total_memory
        sc = batch_defaults(config.scheduler, self.device.type, memory)
        if config.model.deterministic and sc.token_budget < DETERMINISTIC_BLOCK:
            # Chunks end at multiples of the block: a smaller budget could never cut one.
            raise InvalidArgument(
                "max_num_batched_tokens",
                f"must be >= {DETERMINISTIC_BLOCK} with deterministic, got {sc.token_budget}",
            )
        return dataclasses.replace(config, scheduler=sc)

    def _with_fast_all_reduce(self, tp: TPGroup) -> TPGroup:
        if tp.size > 1 and self.config.parallel.tp_one_shot_all_reduce:
            fast = try_one_shot(self.device, self.dtype)  # every rank, here: a collective
            if fast is not None:
                return dataclasses.replace(tp, fast_all_reduce=fast)
        return tp

    def _load_weights(self, files: str) -> LlamaForCausalLM:
        mc = self.config.model
        torch.manual_seed(mc.seed)
        # An FP8 checkpoint (quantization_config) loads as FP8 when no method was named, and
        # with the scales it stores when one was (its values are not quantized again).
        self.quantization = load_quantization(files) or mc.quantization
        model = LlamaForCausalLM(
            self.arch,
            tp=self.tp,
            dtype=self.dtype,
            device=self.device,
            quantization=self.quantization,
        )
        weights = iter_weights(
            files,
            self.arch,
            dtype=self.dtype,
            device=self.device,
            seed=mc.seed,
            sliced=self.tp.size > 1,  # each rank reads only its slices
        )
        # Rank 0 only, and only on a terminal (disable=None): a log file would get every update.
        quiet = True if self.tp.rank != 0 else None
        model.load_weights(tqdm(weights, desc="loading weights", unit=" tensors", disable=quiet))
        model.eval()
        if self.device.type == "cpu" and mc.pack_cpu_weights:
            # No FP8 GEMM on a CPU: quantized weights run as their dequantized values
            # (the same numbers as dequantize-then-matmul at every step, converted once).
            dequantize_linears(model, self.dtype)
            pack_model_for_cpu(model)
        return model

    # ---- 2. memory ----------------------------------------------------------------------

    def build_memory(self) -> None:
        """KV pool, slot allocator, req->token table, radix cache."""
        cc = self.config.cache
        kv_dtype = kv_storage_dtype(cc.kv_cache_dtype, self.dtype)
        self.attention_backend = resolve_attention_backend(
            self.config.attention_backend,
            self.device,
            kv_dtype,
            deterministic=self.config.model.deterministic,
        )
        if self.attention_backend == "flashinfer":  # compiled before the pool is sized
            from radixmesh.worker.attention.flashinfer_backend import compile_kernels

            heads = self.arch.num_attention_heads // self.config.parallel.tp_size
            kv_heads, head_dim = self.model.num_kv_heads, self.arch.head_size
            compile_kernels(heads, kv_heads, head_dim, kv_dtype, self.device)
        if self.device.type == "cuda":
            # FP8 GEMM kernel per shape and row count, timed on this GPU (each TP rank its
            # own) or read from the cache: before the decode CUDA graphs bake the choice
            # in, and before the pool is sized (the timing graphs' memory given back).
            from radixmesh.worker.layers.quantization import fp8_gemm_choice as fgc

            report = fgc.prepare(
                self.model,
                self.dtype,
                fgc.CudaMeasurer(self.device),
                deterministic=self.config.model.deterministic,
            )
            if report is not None:
                torch.cuda.empty_cache()
                for line in [report.summary(), *report.lines]:
                    logger.info("%s%s", f"rank {self.tp.rank}: " if self.tp.size > 1 else "", line)
        self.pool_sizing: PoolSizing | None = None  # set when the pool was auto-sized
        self.kv_pool = self._build_pool()
        if self.device.type == "cuda":  # unset batch sizes follow the pool
            sizing = self.pool_sizing
            graphs = sizing.graph_batch_size if sizing is not None else CUDA_GRAPH_MAX_BATCH_SIZE
            self.config = fit_batches_to_pool(
                self.config,
                self.kv_pool.num_slots,
                auto_running=self._auto_running,
                graph_limit=self.tp.min_over_ranks(graphs, self.device),  # the same graphs
            )
        self.allocator = KVAllocator(self.kv_pool.num_slots, cc.page_size, device=self.device)
        limit = self.config.model.context_length or self.arch.context_limit
        self.context_len = min(limit, self.allocator.num_usable_slots)  # one request fits
        rows = self.config.scheduler.running_cap
        self.req_table = ReqToTokenTable(rows, self.context_len, self.device)
        self.host_tier = self._build_host_tier()
        self.cache = RadixCache(
            self.allocator,
            cc.page_size,
            disable=cc.disable_radix_cache,
            event_block_size=cc.event_block_size,
            host_tier=self.host_tier,
            write_through=cc.host_kv_write_policy == "write_through",
        )

    def _build_host_tier(self) -> HostTier | None:
        """The host-memory KV tier (CacheConfig.host_kv_cache_bytes), or None."""
        cc = self.config.cache
        size = cc.host_kv_cache_bytes
        if cc.disable_radix_cache or size == 0:
            return None
        if self.config.parallel.tp_size > 1:
            # Each rank would copy its own heads' share, in step with rank 0's tree: not
            # built (no two-GPU machine to test it on); the default is off under TP.
            if size is not None:
                raise InvalidArgument(
                    "host_kv_cache_bytes", "is not supported with tensor parallelism (tp_size > 1)"
                )
            return None
        if size is None:
            if self.device.type != "cuda":
                return None
            size = default_host_bytes(
                self.kv_pool.nbytes,
                cc.gpu_memory_share,
                HOST_KV_RAM_FRACTION,
                HOST_KV_POOL_MULTIPLE,
            )
        slots = HostTier.slots_for_bytes(self.kv_pool, size, cc.page_size)
        if slots < 2 * cc.page_size:
            raise InvalidArgument(
                "host_kv_cache_bytes", f"{size} bytes hold {slots} tokens; need 2 pages at least"
            )
        t0 = time.perf_counter()
        tier = HostTier(self.kv_pool, slots, cc.page_size)
        logger.info(
            "host KV tier: %d tokens, %.2f GiB of %s host memory (%.1f s)",
            tier.allocator.num_usable_slots,
            tier.host.nbytes / (1 << 30),
            "pinned" if self.device.type == "cuda" else "plain",
            time.perf_counter() - t0,
        )
        return tier

    def _build_pool(self) -> KVPool:
        cc, arch = self.config.cache, self.arch
        kv_heads = self.model.num_kv_heads  # this rank's share under TP
        self.kv_dtype = kv_storage_dtype(cc.kv_cache_dtype, self.dtype)
        per_slot = KVPool.bytes_per_slot(
            arch.num_hidden_layers, kv_heads, arch.head_size, self.kv_dtype
        )
        if cc.kv_cache_tokens is not None:
            slots = cc.kv_cache_tokens + cc.page_size  # + the reserved page
        elif cc.kv_cache_bytes is None and self.device.type == "cuda":
            self.pool_sizing = auto_size_pool(
                self._on_device(), self.config, per_slot, auto_running=self._auto_running
            )
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
            dtype=self.kv_dtype,
            device=self.device,
        )

    def _on_device(self) -> ModelOnDevice:
        return ModelOnDevice(
            model=self.model,
            arch=self.arch,
            device=self.device,
            dtype=self.dtype,
            kv_dtype=self.kv_dtype,
            attention_backend=self.attention_backend,
            num_heads=self.arch.num_attention_heads // self.config.parallel.tp_size,
        )

    # ---- 3. the runner ------------------------------------------------------------------

    def build_runner(self) -> None:
        """Attention backend, grammar manager, decode CUDA graphs, model runner."""
        mc, gc = self.config.model, self.config.grammar
        attn = create_attention_backend(
            self.attention_backend, self.kv_pool, self.arch.attention_scale
        )
        if hasattr(attn, "shared_prefix"):  # the triton backend's switch
            from radixmesh.worker.attention.triton_backend import shared_prefix_requested

            wanted = shared_prefix_requested(mc.shared_prefix_decode)
            attn.shared_prefix = wanted and self.config.parallel.tp_size == 1
            if wanted and not attn.shared_prefix:  # its graphs would be captured for nothing
                logger.warning(
                    "shared_prefix_decode: off under tensor parallelism (no rank reads the "
                    "slot table's host mirror, where shared prefixes are found)"
                )
        elif mc.shared_prefix_decode:
            logger.warning(
                "shared_prefix_decode: the %s attention backend reads every row's keys "
                "itself (only triton reads shared prefixes once)",
                self.attention_backend,
            )
        if mc.deterministic:
            sc = self.config.scheduler
            rows = max(sc.max_num_batched_tokens or 0, sc.running_cap)
            switched, on_cublas = make_deterministic(
                self.model, attn, self.context_len, max_rows=rows, gemm=mc.deterministic_gemm
            )
            logger.info(
                "deterministic mode: %d linear layers, %d of them on cuBLAS (checked to %d rows)",
                switched,
                on_cublas,
                rows,
            )
        self.grammars = GrammarManager(
            self.tokenizer,
            self.arch.vocab_size,
            self.eos_ids,
            backend=gc.grammar_backend,
            jump_forward=not gc.disable_jump_forward,
            compile_timeout=gc.grammar_compile_timeout,
            compile_processes=gc.grammar_compile_processes,
            compile_memory_bytes=gc.grammar_compile_memory_bytes,
            max_costly_compiles=gc.grammar_max_costly_compiles,
            limits=gc.limits,
        )
        # The compiled grammars' keys the cache-event subscribers know (the engine feeds it
        # the compile cache's announcements on the scheduler thread).
        self.announced_grammars = AnnouncedGrammars()
        self.graph_memory_bytes = 0  # device memory the CUDA graphs took (measured)
        graphs = None
        # A mixture of experts' sparse layers capture too: on CUDA they run the grouped
        # GEMMs (layers/kernels/fused_moe.py), which never read counts back.
        if self.device.type == "cuda" and attn.supports_cuda_graphs:
            graphs = self._capture_decode_graphs(attn) if mc.cuda_graph_max_batch_size else None
        # Forced tokens and short prompt chunks replay the graphs too, as decode rows; not
        # in deterministic mode, where a row's kernel may not depend on the rest of the step.
        shaped = not mc.deterministic and (
            gc.jump_forward_decode_rows or mc.cuda_graph_prefill_reads > 0
        )
        self.runner = ModelRunner(
            self.model,
            attn,
            self.req_table,
            self.arch.vocab_size,
            grammars=self.grammars,
            followers=self.followers,
            decode_graphs=graphs,
            decode_shaped_max_rows=graphs.ladder[-1] if graphs is not None and shaped else 0,
            decode_shaped_forced=gc.jump_forward_decode_rows if graphs is not None else True,
            decode_shaped_prompt_reads=mc.cuda_graph_prefill_reads if graphs is not None else 0,
            keep_features=self.config.speculative.speculative == "eagle",
        )

    def _capture_decode_graphs(self, attn: AttentionBackend) -> DecodeCudaGraphs:
        from radixmesh.worker.cuda_graph import DecodeCudaGraphs

        t0 = time.perf_counter()
        free_before, _ = torch.cuda.mem_get_info(self.device)
        graphs = DecodeCudaGraphs(
            self.model,
            attn,
            self.req_table.table,
            max_batch_size=graph_max_batch_size(self.config),
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

    # ---- 4. the scheduler ---------------------------------------------------------------

    def build_scheduler(self) -> None:
        speculator = None
        sp = self.config.speculative
        if sp.enabled:
            model_drafter: Drafter | None = None
            if self.draft is not None:
                model_drafter = DraftModelDrafter(self.draft.scheduler, self.draft.context_len)
            elif self.eagle_head is not None:
                model_drafter = EagleDrafter(self.eagle_head, self.model)
            drafter = create_drafter(sp, self.cache, model_drafter)
            speculator = Speculator(sp, drafter, self.context_len, self.grammars)
        self.scheduler = Scheduler(
            self.config.scheduler,
            cache=self.cache,
            allocator=self.allocator,
            req_table=self.req_table,
            runner=self.runner,
            output=OutputProcessor(self.context_len),
            page_size=self.config.cache.page_size,
            grammars=self.grammars,
            align=DETERMINISTIC_BLOCK if self.config.model.deterministic else 1,
            speculator=speculator,
        )

    def warm_up(self) -> None:
        """ModelConfig.warmup (None: on CUDA): dummy requests through the scheduler, then
        the cache reset (worker/warmup.py) and the scheduler built again, so the one that
        serves starts with its counters at zero."""
        on = self.config.model.warmup
        if not (self.device.type == "cuda" if on is None else on):
            return
        sc = self.config.scheduler
        plan = warmup_plan(
            sc.token_budget,
            self.context_len,
            self.allocator.num_usable_slots,
            running_cap=sc.running_cap,
            page_size=self.config.cache.page_size,
        )
        if not plan:  # a pool or context too small for any prompt
            return
        self.warmup = run_warmup(self.scheduler, plan, self.arch.vocab_size)
        self.build_scheduler()
        logger.info(
            "warm-up: %d steps (%d to %d tokens) in %.1f s",
            len(self.warmup.steps),
            min(s.num_tokens for s in self.warmup.steps),
            max(s.num_tokens for s in self.warmup.steps),
            self.warmup.seconds,
        )

    def _await_grammar_build(self) -> None:
        """After the warm-up: the grammar backend's build, waited for before the worker
        reports ready. Left to finish in the background, the build (importing xgrammar,
        ~0.8 s of Python on a CPU, and its tokenizer info) shares the GIL with the first
        batch's host work: on the CPU
        (`bench.cold_start --model dummy:tiny --shape 64/16 --requests 256`) the first
        batch ran at 0.29-0.38x a warm one with it and at warm speed without it. A warm
        worker promises a first batch as fast as the next, so it waits; without the
        warm-up (the CPU's default) the build stays in the background. A failed build is
        not fatal here: the first constrained request retries it (GrammarManager)."""
        build = self.grammars.build
        if build is None:
            return
        t0 = time.perf_counter()
        concurrent.futures.wait([build])
        logger.info(
            "grammar backend %s (waited %.1f s after the warm-up)",
            "built" if build.exception() is None else "failed to build",
            time.perf_counter() - t0,
        )

    # ---- serving --------------------------------------------------------------------------

    def stop_ids(self, params: SamplingParams) -> frozenset[int]:
        ids = frozenset(params.stop_token_ids)
        return ids if params.ignore_eos else ids | self.eos_ids

    def validate(self, input_ids: Sequence[int], params: SamplingParams) -> None:
        """Everything the model knows about: raises InvalidArgument naming the field."""
        vocab = self.arch.vocab_size
        check_token_ids(input_ids, vocab)
        params.validate_for(
            prompt_len=len(input_ids),
            context_len=self.context_len,
            vocab_size=vocab,
            max_top_logprobs=self.config.scheduler.max_top_logprobs,
        )

    def add_cache_listener(self, fn: CacheListener) -> None:
        """`fn` hears the radix cache's events and the compiled grammars' (scheduler thread)."""
        self.cache.add_listener(fn)
        self.announced_grammars.add_listener(fn)

    def cache_snapshot(self) -> list[CacheEvent]:
        """The radix cache's contents, then the compiled grammars' keys (scheduler thread)."""
        return [*self.cache.snapshot(), *self.announced_grammars.snapshot()]

    def flush_cache(self) -> bool:
        if self.scheduler.has_work():
            return False
        self.cache.reset()
        return True


def check_token_ids(ids: Sequence[int], vocab: int) -> None:
    """InvalidArgument naming the first id that is not an int (a bool is not) in [0, vocab).

    The common case, every id a plain int in range, is checked by three passes in C (the
    ids' types, min, max): ~80 us for a 1,600-token prompt on the 2-core CPU machine
    against ~155 us for the loop, which a call pays for every prompt before any starts
    (1,024 of them in the shared-prefix benchmark). Anything else takes the loop, which
    finds the id to name (an int subclass other than bool passes it, as before)."""
    if not ids or (set(map(type, ids)) <= _PLAIN_INT and min(ids) >= 0 and max(ids) < vocab):
        return
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise InvalidArgument(
                "input_ids", f"token id {t!r} is outside the vocabulary [0, {vocab})"
            )


_PLAIN_INT = frozenset({int})


def follower_main(
    config: EngineConfig, rank: int, port: int, conn: Connection, parent_pid: int
) -> None:
    """The process of TP rank `rank` > 0 (spawned by `FollowerRanks`): the same Worker as
    rank 0, built on this rank's share of the group, then driven by rank 0's steps."""

    def build(tp: TPGroup) -> tuple[ModelRunner, torch.Tensor]:
        worker = Worker(config, tp=tp)
        return worker.runner, worker.req_table.table

    run_follower(config, rank, port, conn, parent_pid, build)

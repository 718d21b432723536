"""Attention backend on FlashInfer's kernels over the radix cache's token slots (CUDA only).

The pool is FlashInfer's paged KV cache with page size 1: a slot is a page, and
`k_buffers[layer]` [num_slots, Hkv, D] is its NHD layout as it stands, so nothing is
copied. Per step `prepare` flattens the batch's slot-table rows into FlashInfer's CSR
arrays (`kernels/kv_indices.py`: one launch, on the device) and picks a wrapper:

- a decode-only batch: `BatchDecodeWithPagedKVCacheWrapper` with tensor cores (its GQA
  groups of 4 query heads fill a tile's rows; the CUDA-core path read KV at 2.9-3.0 TB/s
  on the H200 against 3.8-4.0 for this one);
- a batch of longer rows (prefill, extend over a cached prefix):
  `BatchPrefillWithPagedKVCacheWrapper`, causal, the new tokens read back from the pool
  after the store, so a prefix and its extension are one range;
- both kinds in one step (chunked prefill beside decoding): each kind through its own
  wrapper (`MixedFlashInferMeta`).

Planning (FlashInfer's host-side split of the work, `plan`) needs the query head count,
which the pool does not know, so it runs at the first layer's call of each step: host
work only, its small tables copied to the device asynchronously. Each plan first waits
for the previous plan's copy to have run: FlashInfer stages a plan in one pinned host
buffer per wrapper, and under the overlap scheduler (overlap.py) the next step's plan
could otherwise overwrite it before the device has read it.

Shared prefixes (off by default, `cascade`): a decode step whose rows share cached
prefixes (shared_prefix.py) can read each group's prefix once (`CascadeMeta`).

CUDA graphs: one decode wrapper per captured batch size, in FlashInfer's graph mode
(fixed buffers, grid sized for the worst case), all sharing one index buffer; before
each replay `before_replay` rebuilds the indices and plans for the real lengths.

Not served here, each refused by name when asked for: an FP8 pool (this project's FP8
cache keeps a power-of-two scale per token and head, kvcache/fp8_kv.py; FlashInfer reads
one scale per tensor, and its own FP8 decode measured no faster than its bf16 on the H200),
float32 (FlashInfer has no float32 kernels), deterministic mode (its split-KV sums depend
on the batch; the triton backend's fixed-order kernels give batch-invariant bits).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from radixmesh.worker.attention.base import AttentionBackend
from radixmesh.worker.attention.kernels.kv_indices import build_kv_indices
from radixmesh.worker.attention.kernels.kv_store import kv_store
from radixmesh.worker.attention.selection import (
    check_flashinfer_supported,
    flashinfer_unavailable_reason,
    import_flashinfer,
)
from radixmesh.worker.attention.shared_prefix import CascadeGroups, plan_cascade
from radixmesh.worker.forward_batch import ForwardBatch, to_device
from radixmesh.worker.kvcache.pool import KVPool

logger = logging.getLogger(__name__)

# Split-KV partial outputs and the prefill's scratch; shared by every wrapper (they run
# one after another on one stream). SGLang's default is of the same order.
WORKSPACE_BYTES = 256 << 20
INT_WORKSPACE_BYTES = 8 << 20  # what FlashInfer allocates for each wrapper's plan
# The paged prefill's kernel family on Hopper: "fa3" (FlashAttention-3 style, wgmma/TMA)
# or "fa2". Chosen by bench/attention_kernels.py (docs/performance.md, "FlashInfer").
PREFILL_BACKEND = "fa3"


@dataclass
class FlashInferMeta:
    """One step's CSR arrays and the wrapper that attends over them."""

    wrapper: Any
    indptr: torch.Tensor  # [B + 1] int32, host (pinned on CUDA)
    indices: torch.Tensor  # [indptr[-1]] int32, device
    qo_indptr: torch.Tensor | None  # [B + 1] int32, host; None for a decode wrapper
    planned: bool = False
    causal: bool = True  # a prefill wrapper's mask


@dataclass
class CascadeMeta:
    """A decode step whose rows share cached prefixes (shared_prefix.py), over q in group
    order: each group's prefix read once for all its rows (`prefix`: FA2's prefill kernel,
    the group's rows as its query tokens, no mask, KV split across SMs as its plan sees
    fit) and each row's own tokens after it (`own`: the decode wrapper), the two partial
    results merged by their log-sum-exps."""

    order: torch.Tensor  # [B] batch rows in group order (device)
    prefix: FlashInferMeta
    own: FlashInferMeta


@dataclass
class MixedFlashInferMeta:
    """A step with decode rows beside longer ones: each kind through its own wrapper (the
    prefill kernel gives a one-token row a whole tile of query rows: measured 2.9x the
    triton backend's time on 8 x 512 new beside 192 decode rows, bench.attention_backends)."""

    decode: FlashInferMeta
    extend: FlashInferMeta
    decode_tokens: torch.Tensor  # [Bd] the decode rows' positions in q (device)
    extend_tokens: torch.Tensor | slice  # the other sequences' rows of q, a slice if contiguous


class FlashInferAttentionBackend(AttentionBackend):
    supports_cuda_graphs = True

    def __init__(self, kv_pool: KVPool, scale: float) -> None:
        super().__init__(kv_pool, scale)
        reason = flashinfer_unavailable_reason(kv_pool.device)
        if reason is not None:
            raise ValueError(f"attention_backend: {reason}")
        check_flashinfer_supported(kv_pool.dtype, deterministic=False)
        self.flashinfer = import_flashinfer()
        device = kv_pool.device
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.decode_wrapper = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", use_tensor_cores=True, backend="fa2"
        )
        self.prefill_wrapper = self.flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend=PREFILL_BACKEND
        )
        # Shared-prefix decode (shared_prefix.py) as a cascade: off, because it does not pay
        # yet. On the H200 it took 0.89x the flat decode's time at 16 groups of 16 rows
        # over 1,536 shared tokens and 1.05x at one group (the L2 cache already serves a
        # prefix's repeated reads), and P2 fell from 342 to 280 req/s with it: its steps
        # run eagerly and plan two wrappers (docs/performance.md, "The flashinfer backend").
        self.cascade = False
        self.num_cascade_steps = 0
        self._cascade_wrappers: tuple[Any, Any] | None = None  # made at first use
        self._groups: CascadeGroups | None = None
        self._groups_for: ForwardBatch | None = None
        self.num_qo_heads: int | None = None  # learned from the first q
        # Per wrapper (by id): the event after its last plan's copies.
        self._fences: dict[int, torch.cuda.Event] = {}
        self._ones = torch.ones(1, dtype=torch.int32, pin_memory=True)  # last_page_lens
        # Graph mode: the index buffer all graph wrappers share (`graph_metadata`).
        self._graph_indices: torch.Tensor | None = None

    def enable_deterministic(self, max_context_len: int) -> None:
        check_flashinfer_supported(self.kv_pool.dtype, deterministic=True)

    # ---- per step ------------------------------------------------------------------

    def prepare(self, batch: ForwardBatch) -> None:
        lens = batch.extend_lens_cpu
        rows, seq_lens = batch.req_rows, batch.seq_lens
        decode = [i for i, n in enumerate(lens) if n == 1]
        if len(decode) == len(lens) and (groups := self._cascade_groups(batch)) is not None:
            batch.attn_metadata = self._cascade_meta(batch, groups)
            self.num_cascade_steps += 1
            return
        if not decode or len(decode) == len(lens):  # one kind: one wrapper over the batch
            csr = self._csr(batch.seq_lens_cpu, rows, seq_lens, batch.req_to_token)
            if decode:
                batch.attn_metadata = FlashInferMeta(self.decode_wrapper, *csr, None)
            else:
                qo = _host_indptr(lens)
                batch.attn_metadata = FlashInferMeta(self.prefill_wrapper, *csr, qo)
            return
        extend = [i for i, n in enumerate(lens) if n > 1]
        starts = [0, *itertools.accumulate(lens)]
        device = batch.req_to_token.device
        d = to_device(torch.tensor(decode, dtype=torch.int64), device)  # no wait (to_device)
        e = to_device(torch.tensor(extend, dtype=torch.int64), device)
        seq_cpu = batch.seq_lens_cpu
        d_csr = self._csr([seq_cpu[i] for i in decode], rows[d], seq_lens[d], batch.req_to_token)
        e_csr = self._csr([seq_cpu[i] for i in extend], rows[e], seq_lens[e], batch.req_to_token)
        e_tokens = [t for i in extend for t in range(starts[i], starts[i + 1])]
        contiguous = e_tokens == list(range(e_tokens[0], e_tokens[-1] + 1))
        e_qo = _host_indptr(lens[i] for i in extend)
        batch.attn_metadata = MixedFlashInferMeta(
            decode=FlashInferMeta(self.decode_wrapper, *d_csr, None),
            extend=FlashInferMeta(self.prefill_wrapper, *e_csr, e_qo),
            decode_tokens=to_device(torch.tensor([starts[i] for i in decode]), device),
            extend_tokens=(
                slice(e_tokens[0], e_tokens[-1] + 1)
                if contiguous
                else to_device(torch.tensor(e_tokens), device)
            ),
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        k_buf = self.kv_pool.k_buffers[layer_id]  # [num_slots, Hkv, D]: pages of one token
        v_buf = self.kv_pool.v_buffers[layer_id]
        kv_store(k_buf, v_buf, batch.out_cache_loc, k, v, None)
        self.num_qo_heads = q.shape[1]
        meta = batch.attn_metadata
        if isinstance(meta, MixedFlashInferMeta):
            return self._forward_mixed(q, (k_buf, v_buf), meta)
        if isinstance(meta, CascadeMeta):
            return self._forward_cascade(q, (k_buf, v_buf), meta)
        return self._run(meta, q.contiguous(), (k_buf, v_buf))

    def _run(
        self,
        meta: FlashInferMeta,
        q: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not meta.planned:  # the step's first layer
            self._plan(meta)
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        meta.wrapper.run(q, kv, out=out)
        return out

    def _forward_mixed(
        self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], meta: MixedFlashInferMeta
    ) -> torch.Tensor:
        """Extend rows through the prefill wrapper, decode rows gathered ([Bd, Hq, D])
        through the decode wrapper; both written back into one output."""
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        rows = meta.extend_tokens
        if isinstance(rows, slice):
            self._run(meta.extend, q[rows].contiguous(), kv, out=out[rows])
        else:
            out.index_copy_(0, rows, self._run(meta.extend, q.index_select(0, rows), kv))
        q_dec = q.index_select(0, meta.decode_tokens)
        return out.index_copy_(0, meta.decode_tokens, self._run(meta.decode, q_dec, kv))

    # ---- shared prefixes ---------------------------------------------------------------

    def _cascade_groups(self, batch: ForwardBatch) -> CascadeGroups | None:
        """The batch's shared-prefix groups when a cascade pays (memoized for the batch:
        `graph_can_run` asks first, then `prepare`)."""
        if not self.cascade:
            return None
        host, rows = batch.req_to_token_host, batch.req_rows_cpu
        if host is None or rows is None:
            return None
        if self._groups_for is not batch:
            self._groups = plan_cascade(host, rows, batch.seq_lens_cpu)
            self._groups_for = batch
        return self._groups

    def _cascade_meta(self, batch: ForwardBatch, g: CascadeGroups) -> CascadeMeta:
        device = batch.req_to_token.device
        seq = batch.seq_lens_cpu
        order = to_device(torch.tensor(g.order, dtype=torch.int64), device)
        rows = batch.req_rows[order]  # [B] table rows in group order
        heads = [sum(g.sizes[:i]) for i in range(len(g.sizes))]  # each group's first row
        prefix_of_row = [p for p, n in zip(g.prefix_lens, g.sizes, strict=True) for _ in range(n)]
        # Level 0: a group's prefix, from its first row; its rows' queries are its "tokens".
        head_rows = rows[to_device(torch.tensor(heads, dtype=torch.int64), device)]
        prefix_dev = to_device(torch.tensor(g.prefix_lens, dtype=torch.int64), device)
        indptr0, indices0 = self._csr(g.prefix_lens, head_rows, prefix_dev, batch.req_to_token)
        # Level 1: each row's tokens after its group's prefix.
        own = [seq[i] - p for i, p in zip(g.order, prefix_of_row, strict=True)]
        indptr1 = _host_indptr(own)
        indices1 = torch.empty(int(indptr1[-1]), dtype=torch.int32, device=device)
        starts = to_device(torch.tensor(prefix_of_row, dtype=torch.int64), device)
        build_kv_indices(
            batch.req_to_token, rows, batch.seq_lens[order], to_device(indptr1, device),
            indices1, starts=starts,
        )  # fmt: skip
        if self._cascade_wrappers is None:  # each wrapper pins 8 MiB of host memory
            self._cascade_wrappers = (
                self.flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                    self.workspace, "NHD", backend="fa2"
                ),
                self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_tensor_cores=True, backend="fa2"
                ),
            )
        prefix_wrapper, own_wrapper = self._cascade_wrappers
        return CascadeMeta(
            order=order,
            prefix=FlashInferMeta(
                prefix_wrapper, indptr0, indices0, _host_indptr(g.sizes),
                causal=False,  # every row of a group sees the whole prefix
            ),
            own=FlashInferMeta(own_wrapper, indptr1, indices1, None),
        )  # fmt: skip

    def _forward_cascade(
        self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], meta: CascadeMeta
    ) -> torch.Tensor:
        q_grouped = q.index_select(0, meta.order)
        for level in (meta.own, meta.prefix):
            if not level.planned:  # the step's first layer
                self._plan(level)
        out, lse = meta.own.wrapper.run(q_grouped, kv, return_lse=True)
        out_prefix, lse_prefix = meta.prefix.wrapper.run(q_grouped, kv, return_lse=True)
        self.flashinfer.merge_state_in_place(out, lse, out_prefix, lse_prefix)
        return torch.empty_like(q).index_copy_(0, meta.order, out)

    # ---- CUDA graphs -----------------------------------------------------------------

    def graph_metadata(
        self, batch_size: int, max_context_len: int, num_heads: int, variant: int = 0
    ) -> Any:
        """A decode wrapper in graph mode for `batch_size` rows, planned for one token
        each (the static batch's); `before_replay` re-plans it for each real batch."""
        device = self.kv_pool.device
        self.num_qo_heads = num_heads
        if self._graph_indices is None:
            # Every row of the largest graph at full context, or four times the pool's
            # slots (shared prefixes count once per row), whichever is less; a batch
            # with more runs eagerly (`graph_can_run`).
            n = min(batch_size * max_context_len, 4 * self.kv_pool.num_slots)
            # (pool_sizing.flashinfer_reserve_bytes counts the first bound)
            self._graph_indices = torch.zeros(max(n, batch_size), dtype=torch.int32, device=device)
        wrapper = self.flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=True,
            paged_kv_indptr_buffer=torch.zeros(batch_size + 1, dtype=torch.int32, device=device),
            paged_kv_indices_buffer=self._graph_indices,
            paged_kv_last_page_len_buffer=torch.ones(batch_size, dtype=torch.int32, device=device),
            backend="fa2",
        )
        indptr = _host_indptr([1] * batch_size)
        indices = torch.zeros(batch_size, dtype=torch.int32, device=device)  # slot 0
        meta = FlashInferMeta(wrapper, indptr, indices, None)
        self._plan(meta)
        return meta

    def graph_can_run(self, batch: ForwardBatch, graph_batch_size: int) -> bool:
        """Not when the rows share prefixes worth a cascade (it runs eagerly: its group
        structure changes from step to step), nor when the indices overflow the buffer."""
        assert self._graph_indices is not None
        if self._cascade_groups(batch) is not None:
            return False
        padding = graph_batch_size - batch.batch_size
        return sum(batch.seq_lens_cpu) + padding <= self._graph_indices.shape[0]

    def before_replay(self, static: ForwardBatch, batch: ForwardBatch, padding: int) -> None:
        """Plan the graph's wrapper for `batch`, now in `static`'s buffers, then `padding`
        rows of one token."""
        meta: FlashInferMeta = static.attn_metadata
        lens = [*batch.seq_lens_cpu, *[1] * padding]
        csr = self._csr(lens, static.req_rows, static.seq_lens, static.req_to_token)
        meta.indptr, meta.indices = csr
        self._plan(meta)

    # ---- helpers ---------------------------------------------------------------------

    def _csr(
        self,
        seq_lens_cpu: list[int],
        req_rows: torch.Tensor,
        seq_lens: torch.Tensor,
        req_to_token: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(indptr on the host, indices on the device) of these sequences' slots."""
        indptr = _host_indptr(seq_lens_cpu)
        device = req_to_token.device
        indices = torch.empty(int(indptr[-1]), dtype=torch.int32, device=device)
        build_kv_indices(req_to_token, req_rows, seq_lens, to_device(indptr, device), indices)
        return indptr, indices

    def _plan(self, meta: FlashInferMeta) -> None:
        self._wait_fence(meta.wrapper)
        assert self.num_qo_heads is not None
        last = self._last_page_lens(meta.indptr.shape[0] - 1)
        pool = self.kv_pool
        common = {
            "q_data_type": pool.dtype,
            "kv_data_type": pool.dtype,
            "sm_scale": self.scale,
        }
        if meta.qo_indptr is None:
            meta.wrapper.plan(
                meta.indptr,
                meta.indices,
                last,
                self.num_qo_heads,
                pool.num_kv_heads,
                pool.head_dim,
                1,
                **common,
            )
        else:
            meta.wrapper.plan(
                meta.qo_indptr,
                meta.indptr,
                meta.indices,
                last,
                self.num_qo_heads,
                pool.num_kv_heads,
                pool.head_dim,
                1,
                causal=meta.causal,
                **common,
            )
        meta.planned = True
        self._record_fence(meta.wrapper)

    def _wait_fence(self, wrapper: Any) -> None:
        fence = self._fences.get(id(wrapper))
        if fence is not None:
            fence.synchronize()  # this wrapper's previous plan was copied from its pinned buffer

    def _record_fence(self, wrapper: Any) -> None:
        fence = self._fences[id(wrapper)] = torch.cuda.Event()
        fence.record()

    def _last_page_lens(self, n: int) -> torch.Tensor:
        """[n] ones, pinned: every page (slot) of the pool holds one token."""
        if self._ones.shape[0] < n:
            self._ones = torch.ones(2 * n, dtype=torch.int32, pin_memory=True)
        return self._ones[:n]


def _host_indptr(lengths: Iterable[int]) -> torch.Tensor:
    """[0, cumsum(lengths)] as int32 on the host, in pinned memory where CUDA is: FlashInfer
    copies it to the device, and a copy from pageable memory can wait for the stream."""
    lengths = list(lengths)
    pin = torch.cuda.is_available()
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32, pin_memory=pin)
    if lengths:
        torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0, out=out[1:])
    return out


def compile_kernels(
    num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> float:
    """Build (JIT, or load from FlashInfer's on-disk cache) every kernel module the backend
    will launch for this shape, the decode, prefill and merge modules at once on three
    threads (each a ninja build over all cores), so that a worker compiles before it reports ready
    and not at its first request. Returns the seconds it took.

    Compiled modules land in ~/.cache/flashinfer (FLASHINFER_WORKSPACE_BASE moves it); a
    later start finds them there and loads them in well under a second."""
    t0 = time.perf_counter()
    pool = KVPool(
        num_slots=2, num_layers=1, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype,
        device=device,
    )  # fmt: skip
    backends = [FlashInferAttentionBackend(pool, head_dim**-0.5) for _ in range(2)]
    table = torch.ones((1, 2), dtype=torch.int64, device=device)
    q = torch.zeros((2, num_heads, head_dim), dtype=dtype, device=device)
    kv = torch.zeros((2, num_kv_heads, head_dim), dtype=dtype, device=device)

    def one(backend: FlashInferAttentionBackend, extend: int) -> None:
        batch = ForwardBatch.build(
            input_ids=[0] * extend,
            out_cache_loc=torch.ones(extend, dtype=torch.int64),
            req_rows=[0],
            prefix_lens=[2 - extend],
            extend_lens=[extend],
            req_to_token=table,
        )
        backend.prepare(batch)
        backend.forward(q[:extend], kv[:extend], kv[:extend], 0, batch)

    def merge() -> None:  # the cascade's merge of partial results
        o = torch.zeros((1, num_heads, head_dim), dtype=dtype, device=device)
        lse = torch.zeros((1, num_heads), dtype=torch.float32, device=device)
        backends[0].flashinfer.merge_state_in_place(o, lse, o.clone(), lse.clone())

    with ThreadPoolExecutor(3) as ex:
        done = [ex.submit(one, backends[0], 1), ex.submit(one, backends[1], 2), ex.submit(merge)]
        for f in done:
            f.result()  # raises what failed
    torch.cuda.synchronize(device)
    took = time.perf_counter() - t0
    logger.info("flashinfer kernels for %d/%d heads of %d ready in %.1f s",
                num_heads, num_kv_heads, head_dim, took)  # fmt: skip
    return took

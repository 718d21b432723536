"""Attention backend on Triton kernels over the paged KV pool (GPU; CPU via TRITON_INTERPRET).

Per step `prepare` picks the kernel: a decode-only batch (one new token per sequence) runs
flash-decoding with a split count sized to fill the GPU; an extend-only batch runs the
extend kernel, reading the new tokens' keys from this forward's k/v (contiguous rows)
where they hold the pool's bits: where the pool has their dtype, or over an FP8 pool,
where the store kernel wrote the pool's dequantized values back into them (bfloat16 and
float32 k/v; kv_store.py's `write_back`), and through the slot table otherwise (float16
over an FP8 pool); a batch with both
(chunked prefill, jump-forward's forced tokens beside decoding rows) runs each kernel on
its own rows, because the extend kernel computes a BLOCK_M-row tile for every one-row
query (64x the work of a decode row). Per layer `forward` stores the new k/v with the
store kernel, then attends. With an FP8 pool every kernel also gets its scale exponents
(kvcache/fp8_kv.py). Metadata holds device tensors only, built once per
step, so every layer's launches need no host-device sync.

Deterministic mode (`enable_deterministic`): every row, decode rows included, runs through
the extend kernel with one key-tile size and absolute tiles (`absolute_tiles`): query
blocks and key tiles at fixed multiples of the position, so a token's bits depend on its
position and keys only, whether it is decoded, prefilled in any chunk or extended over a
cached prefix. A token the prompt ends on alone (a one-token last chunk runs as a decode
step) and a generated token that a later prompt repeats then hold in the KV cache the bits
a cold prefill computes. Flash-decoding's splits would sum another way (its running
max and merge), so the mode gives up their parallelism: a decode program per (sequence,
KV head) walks all the keys.

Shared prefixes (off by default: `RADIXMESH_SHARED_PREFIX_DECODE=1`, or `shared_prefix` on
the backend): a decode-only step whose rows share cached prefixes worth reading once
(attention/shared_prefix.py's `plan_cascade`, from the slot table's host mirror) runs
kernels/decode_shared.py: each group's prefix read once per chunk of rows, each row's own
keys through the flat kernel, one merge. Each decode graph size of MIN_ROWS rows or more
is then captured twice: flat, and with those launches over chunk lists with room for the
batch size, which `before_replay` packs for each step that shares (`graph_variant` picks
the graph); steps without graphs run the same kernels eagerly. Over an FP8 pool the shared
launches read through Triton's conversion path, not the flat graphs' CUDA kernel. With
RADIXMESH_SHARED_PREFIX_FUSED=1 (16-bit pools) a sharing step is one launch instead:
every row in a chunk, each chunk's program reading its prefix and its rows' own keys
(decode_shared.py's fused kernel; not yet measured on a GPU, so off). Not
under tensor parallelism (the model runner gives the host mirror only to a single rank,
so every rank runs the same path).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from radixmesh.worker.attention.base import AttentionBackend
from radixmesh.worker.attention.kernels import decode_fp8_cuda
from radixmesh.worker.attention.kernels.decode_attention import (
    DecodeConfig,
    decode_attention,
    decode_workspace,
)
from radixmesh.worker.attention.kernels.decode_shared import (
    ChunkLayout,
    ChunkLists,
    PrefixChunks,
    chunk_lists,
    chunk_views,
    decode_attention_fused,
    decode_attention_shared,
    pack_chunks,
    prefix_chunks,
    rows_per_chunk,
)
from radixmesh.worker.attention.kernels.extend_attention import (
    LONG_EXTEND,
    ExtendConfig,
    extend_attention,
    extend_config,
)
from radixmesh.worker.attention.kernels.kv_store import kv_store, writes_back_exactly
from radixmesh.worker.attention.shared_prefix import MIN_ROWS, CascadeGroups, plan_cascade
from radixmesh.worker.forward_batch import ForwardBatch, to_device
from radixmesh.worker.kvcache.pool import KVPool

MIN_KEYS_PER_SPLIT = 256
# A shared-prefix graph's room for prefix splits, and its own keys' splits (the flat rule's
# count for the full context would be 2 at 256 rows): more splits only pay when a step has
# few chunks or a lone row a long context, and every split widens the merge. With 4 + 2
# the graph's launches took 124-134 us of kernels where the eager step's 1 + 1 took 95-104
# (merge 24 against 8 us, own keys 44-47 against 35-38; H100, 2026-12-06,
# attention_backends-shared-h100.json, triton-shared-graph).
GRAPH_PREFIX_SPLITS = 2
GRAPH_OWN_SPLITS = 1
MAX_SPLITS = 32
WAVES = 16
SHARED_PREFIX_SWITCH = "RADIXMESH_SHARED_PREFIX_DECODE"  # "1": shared-prefix decode on
# "1": its steps in one launch (decode_shared.py's fused kernel: each chunk's program reads
# its prefix and its rows' own keys and writes their outputs; no split, no merge) over a
# 16-bit pool. Off: not yet measured on a GPU (docs/performance.md, "Shared-prefix decode").
SHARED_PREFIX_FUSED_SWITCH = "RADIXMESH_SHARED_PREFIX_FUSED"


@dataclass
class DecodeMeta:
    num_splits: int
    # [B, Hq, S, D], [B, Hq, S] float32; allocated by the first layer (it knows Hq), reused
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None
    # Deterministic mode: the decode rows as one-token extends, (prefix lengths [B],
    # ones [B], q_start [B]); the prefix lengths are rewritten by layer 0 of each forward
    # (in a CUDA graph: by its replay), the others are constants.
    as_extend: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


@dataclass
class ExtendMeta:
    q_start: torch.Tensor  # [B] first row of each sequence's new tokens
    max_extend: int


@dataclass
class MixedMeta:
    """Decode rows through flash-decoding, the other sequences through the extend kernel."""

    decode_tokens: torch.Tensor  # [Bd] the decode rows' positions in q
    decode_req_rows: torch.Tensor  # [Bd]
    decode_seq_lens: torch.Tensor  # [Bd]
    decode: DecodeMeta
    extend_req_rows: torch.Tensor  # [Be]
    extend_prefix_lens: torch.Tensor  # [Be]
    extend_lens: torch.Tensor  # [Be]
    extend: ExtendMeta  # q_start [Be] into the whole q


@dataclass
class SharedPrefixMeta:
    """A decode-only step over shared prefixes (kernels/decode_shared.py). Eager: the
    groups from `prepare`; the chunks, the own keys' splits and the workspace made by the
    first layer (it knows the query heads a KV head, which size a chunk). A CUDA graph's
    (`graph_metadata`): chunks with a batch size's room, rewritten before each replay."""

    groups: CascadeGroups | None
    chunks: PrefixChunks | None = None
    own_splits: int = 1
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None
    layout: ChunkLayout | None = None  # a graph's room (None: eager)
    fused: bool = False  # every row in a chunk, one launch (decode_attention_fused)


def choose_num_splits(batch_size: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Enough (sequence, KV head, split) programs for WAVES waves over the SMs, but no split
    shorter than MIN_KEYS_PER_SPLIT keys (each split costs a partial write and a merge).

    Many waves pay even when one would fill the GPU: on the H200 at batch 256, context 4k,
    8 KV heads (2048 programs, 15.5 waves) one split read KV at 87% of copy bandwidth and
    two splits at 95% (bench/results/attention_kernels-h200.json)."""
    programs = batch_size * num_kv_heads
    for_waves = -(-WAVES * num_sms // programs)
    for_length = -(-max_seq_len // MIN_KEYS_PER_SPLIT)
    return max(1, min(for_waves, for_length, MAX_SPLITS))


def shared_prefix_requested(option: bool) -> bool:
    """Whether the shared-prefix decode is asked for: the engine option
    (`shared_prefix_decode`) or its env var. The worker turns it on for one rank only,
    and pool sizing counts its graphs by the same answer."""
    return option or os.environ.get(SHARED_PREFIX_SWITCH, "0") == "1"


def choose_prefix_splits(num_chunks: int, num_kv_heads: int, max_prefix: int, num_sms: int) -> int:
    """Splits of the shared-prefix kernel's keys (kernels/decode_shared.py): one wave of
    (chunk, KV head, split) programs, no more, and no split shorter than
    MIN_KEYS_PER_SPLIT keys.

    Unlike the flat kernel's (`choose_num_splits`), more waves lose here: a split writes a
    partial for every row of its chunk, 16 rows at once, and widens the merge. On an H100
    (2026-12-06, `bench.attention_backends --shared-sweep`, attention_shared_sweep-h100.json)
    16 chunks x 8 KV heads over 1,536 shared keys took 91-103 us of kernels with one split,
    126-144 us with the six the flat rule gives, 168-187 us with 16."""
    programs = num_chunks * num_kv_heads
    for_length = -(-max_prefix // MIN_KEYS_PER_SPLIT)
    return max(1, min(num_sms // programs, for_length, MAX_SPLITS))


def deterministic_decode_config(cfg: ExtendConfig) -> ExtendConfig:
    """Deterministic mode's tiles for a decode-only batch: one warpgroup's share of the
    extend tiles (`cfg`'s rows over its warps / 4, on 4 warps), the same key tiles.

    A decode row fills G of a tile's rows (G query heads per KV head); the rest are
    padding the matrix unit computes anyway, and at 256 rows of decode their products cost
    as much as reading the keys. Each warpgroup of `cfg`'s 8 warps computes 64 rows with
    the same instruction (wgmma, 64 rows per instruction on Hopper) and the same K order as
    a 4-warp program of 64 rows, so a row gets the same bits from either; the key tiles,
    which fix the softmax's reduction order, are the same. Checked bit for bit on the GPU
    (tests/worker/attention/test_deterministic_kernels.py)."""
    warpgroups = max(1, cfg.num_warps // 4)
    return ExtendConfig(cfg.block_rows // warpgroups, cfg.block_n, 4, cfg.num_stages)


class TritonAttentionBackend(AttentionBackend):
    supports_cuda_graphs = True

    def __init__(self, kv_pool: KVPool, scale: float) -> None:
        super().__init__(kv_pool, scale)
        device = kv_pool.device
        if device.type == "cuda":
            self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count
            if kv_pool.quantized:  # the FP8 decode kernel built (or loaded) at start
                decode_fp8_cuda.prepare_library(device)
        else:
            self.num_sms = 4  # the interpreter: few programs, few splits
        self.extend_cfg: ExtendConfig | None = None  # deterministic mode's configuration
        self.decode_cfg: ExtendConfig | None = None  # and its decode-only batches'
        # The decode kernel's launch; None: `decode_config`'s for the device and pool.
        self.decode_launch: DecodeConfig | None = None
        self.shared_prefix = shared_prefix_requested(False)
        self.shared_fused = os.environ.get(SHARED_PREFIX_FUSED_SWITCH, "0") == "1"
        self.num_shared_prefix_steps = 0
        self._groups_for: ForwardBatch | None = None  # `_shared_groups`' batch and answer
        self._groups: CascadeGroups | None = None
        self._shared_graph_sizes: set[int] = set()  # graphs captured with shared prefixes
        self._graph_buffer: torch.Tensor | None = None  # their workspace (one at a time)

    def enable_deterministic(self, max_context_len: int) -> None:
        super().enable_deterministic(max_context_len)
        self.extend_cfg = extend_config(LONG_EXTEND, self.kv_pool.head_dim)
        self.decode_cfg = deterministic_decode_config(self.extend_cfg)

    def decode_meta(self, batch_size: int, max_seq_len: int) -> DecodeMeta:
        """The split count of a decode batch (deterministic mode: no splits, see the
        module doc)."""
        if self.deterministic:
            return DecodeMeta(1)
        splits = choose_num_splits(batch_size, self.kv_pool.num_kv_heads, max_seq_len, self.num_sms)
        return DecodeMeta(splits)

    def graph_metadata(
        self, batch_size: int, max_context_len: int, num_heads: int, variant: int = 0
    ) -> DecodeMeta | SharedPrefixMeta:
        """Variant 0: the split count for the full context (splits past a short sequence's
        end exit at once) and a workspace allocated once: nothing to redo before a replay.
        Variant 1 (`graph_variants`): the shared-prefix launches over chunks with room for
        the batch size, which `before_replay` packs for each step."""
        head_dim = self.kv_pool.head_dim
        device = self.kv_pool.device
        if variant == 0:
            meta = self.decode_meta(batch_size, max_context_len)
            splits = meta.num_splits
            meta.workspace = decode_workspace(batch_size, num_heads, head_dim, splits, device)
            return meta
        assert variant == 1 and self._shared_graphs(batch_size)
        hkv = self.kv_pool.num_kv_heads
        per_chunk = rows_per_chunk(num_heads // hkv)
        self._shared_graph_sizes.add(batch_size)
        if self._fused:  # every row in a chunk of its own at most: room for B chunks
            layout = ChunkLayout(batch_size, batch_size, batch_size)
            alone = chunk_lists(None, [1] * batch_size, per_chunk, lone=True)
            packed = pack_chunks(alone, 1, layout).to(device)
            chunks = chunk_views(packed, layout, per_chunk, 1, layout.items)
            return SharedPrefixMeta(None, chunks, layout=layout, fused=True)
        # Chunks hold 2 rows or more of a group, but for a group's last; one wave of prefix
        # programs needs at most num_sms // hkv items, more chunks one split each.
        layout = ChunkLayout(batch_size, batch_size, max(batch_size, self.num_sms // hkv))
        most = choose_prefix_splits(1, hkv, max_context_len, self.num_sms)
        max_splits = min(GRAPH_PREFIX_SPLITS, most)
        packed = pack_chunks(None, max_splits, layout).to(device)
        chunks = chunk_views(packed, layout, per_chunk, max_splits, layout.items)
        splits = max_splits + GRAPH_OWN_SPLITS
        workspace = self._graph_workspace(batch_size, num_heads, splits)
        return SharedPrefixMeta(None, chunks, GRAPH_OWN_SPLITS, workspace, layout)

    def graph_variants(self, batch_size: int) -> int:
        """Two with the shared-prefix decode on, from MIN_ROWS rows (not in deterministic
        mode): the flat graph, for steps whose rows share too little, and
        the shared-prefix one. A step without chunks could run the latter too, but its extra
        launches cost the flat steps 3% of P1's throughput on an H100 (2026-12-06)."""
        return 2 if self._shared_graphs(batch_size) else 1

    def _shared_graphs(self, batch_size: int) -> bool:
        return self.shared_prefix and not self.deterministic and batch_size >= MIN_ROWS

    @property
    def _fused(self) -> bool:
        return self.shared_fused and not self.kv_pool.quantized

    def _graph_workspace(
        self, batch_size: int, num_heads: int, splits: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of one buffer that every shared-prefix graph uses (one replays at a time):
        [B, Hq, S, D] and [B, Hq, S] float32. The largest graph is captured first."""
        d = self.kv_pool.head_dim
        o_size, l_size = batch_size * num_heads * splits * d, batch_size * num_heads * splits
        if self._graph_buffer is None or self._graph_buffer.numel() < o_size + l_size:
            self._graph_buffer = torch.empty(
                o_size + l_size, dtype=torch.float32, device=self.kv_pool.device
            )
        buf = self._graph_buffer
        mid_o = buf[:o_size].view(batch_size, num_heads, splits, d)
        return mid_o, buf[o_size : o_size + l_size].view(batch_size, num_heads, splits)

    def before_replay(self, static: ForwardBatch, batch: ForwardBatch, padding: int) -> None:
        """A shared-prefix graph's chunks for `batch` (none when its rows share too little),
        packed into the graph's buffer through pinned memory (no wait for the step in
        flight); a flat graph needs nothing."""
        meta = static.attn_metadata
        if not isinstance(meta, SharedPrefixMeta):
            return
        assert meta.layout is not None and meta.chunks is not None
        groups = self._shared_groups(batch)
        lists = None
        if groups is not None or meta.fused:  # fused: every row in a chunk, whatever it shares
            per_chunk = meta.chunks.rows_per_chunk
            lists = chunk_lists(groups, batch.seq_lens_cpu, per_chunk, lone=meta.fused)
        splits = 1 if meta.fused else self._prefix_splits(lists, meta.chunks.max_splits)
        packed = pack_chunks(lists, splits, meta.layout)
        if packed.device != meta.chunks.packed.device:
            packed = packed.pin_memory()
        meta.chunks.packed.copy_(packed, non_blocking=True)
        if groups is not None:
            self.num_shared_prefix_steps += 1

    def _prefix_splits(self, lists: ChunkLists | None, max_splits: int) -> int:
        if lists is None:
            return 1
        hkv = self.kv_pool.num_kv_heads
        splits = choose_prefix_splits(lists.num_chunks, hkv, max(lists.prefix_lens), self.num_sms)
        return min(splits, max_splits)

    def prepare(self, batch: ForwardBatch) -> None:
        if batch.is_decode_only:
            if (groups := self._shared_groups(batch)) is not None:
                batch.attn_metadata = SharedPrefixMeta(groups)
                self.num_shared_prefix_steps += 1
                return
            batch.attn_metadata = self.decode_meta(batch.batch_size, max(batch.seq_lens_cpu))
            return
        starts = [0]
        for n in batch.extend_lens_cpu[:-1]:
            starts.append(starts[-1] + n)
        # Through pinned memory, without a wait: `torch.tensor(..., device=cuda)` copies from
        # pageable memory and synchronizes the stream, i.e. waits for the step in flight,
        # which under the overlap scheduler idles the GPU for the rest of the launch.
        q_start = to_device(torch.tensor(starts, dtype=torch.int64), batch.req_to_token.device)
        batch.attn_metadata = ExtendMeta(q_start, max(batch.extend_lens_cpu))
        decode = [i for i, n in enumerate(batch.extend_lens_cpu) if n == 1]
        if decode and len(decode) < batch.batch_size and not self.deterministic:
            batch.attn_metadata = self._mixed(batch, decode, q_start)

    def graph_can_run(self, batch: ForwardBatch, graph_batch_size: int) -> bool:
        """Not when the rows share prefixes worth reading once and no graph of that size
        was captured with the shared-prefix launches (such steps run eagerly)."""
        if graph_batch_size in self._shared_graph_sizes:
            return True
        return self._shared_groups(batch) is None

    def graph_variant(self, batch: ForwardBatch, graph_batch_size: int) -> int:
        """The shared-prefix graph for rows that share prefixes worth reading once."""
        shared = graph_batch_size in self._shared_graph_sizes
        return 1 if shared and self._shared_groups(batch) is not None else 0

    def _shared_groups(self, batch: ForwardBatch) -> CascadeGroups | None:
        """The decode batch's shared-prefix groups when reading prefixes once pays, else
        None (memoized for the batch: `graph_can_run` asks first, then `prepare`)."""
        if not self.shared_prefix or self.deterministic:
            return None
        if self._groups_for is not batch:
            host, rows = batch.req_to_token_host, batch.req_rows_cpu
            groups = None
            if host is not None and rows is not None:
                groups = plan_cascade(host, rows, batch.seq_lens_cpu)
            self._groups_for, self._groups = batch, groups
        return self._groups

    def _shared_chunks(self, batch: ForwardBatch, meta: SharedPrefixMeta, q: torch.Tensor) -> bool:
        """Fill an eager step's `meta` at the first layer: chunks sized for q's query heads
        a KV head, the own keys' splits, the workspace. False when no group has two rows
        (the step then runs the flat kernel)."""
        assert meta.groups is not None
        hkv = self.kv_pool.num_kv_heads
        b, hq, d = q.shape
        device = q.device
        per_chunk = rows_per_chunk(hq // hkv)
        fused = self._fused and q.dtype == self.kv_pool.dtype
        lists = chunk_lists(meta.groups, batch.seq_lens_cpu, per_chunk, lone=fused)
        if lists is None:
            return False
        if fused:
            meta.chunks = prefix_chunks(lists, 1, per_chunk, lambda t: to_device(t, device))
            meta.fused = True
            return True
        splits = self._prefix_splits(lists, MAX_SPLITS)
        meta.chunks = prefix_chunks(lists, splits, per_chunk, lambda t: to_device(t, device))
        max_own = max(n - s for n, s in zip(batch.seq_lens_cpu, lists.starts, strict=True))
        meta.own_splits = choose_num_splits(b, hkv, max_own, self.num_sms)
        meta.workspace = decode_workspace(b, hq, d, splits + meta.own_splits, device)
        return True

    def _mixed(self, batch: ForwardBatch, decode: list[int], q_start: torch.Tensor) -> MixedMeta:
        lens = batch.extend_lens_cpu
        extend = [i for i, n in enumerate(lens) if n > 1]
        dev = q_start.device
        d = to_device(torch.tensor(decode, dtype=torch.int64), dev)  # no wait (see prepare)
        e = to_device(torch.tensor(extend, dtype=torch.int64), dev)
        longest = max(batch.seq_lens_cpu[i] for i in decode)
        return MixedMeta(
            decode_tokens=q_start[d],
            decode_req_rows=batch.req_rows[d],
            decode_seq_lens=batch.seq_lens[d],
            decode=self.decode_meta(len(decode), longest),
            extend_req_rows=batch.req_rows[e],
            extend_prefix_lens=batch.prefix_lens[e],
            extend_lens=batch.extend_lens[e],
            extend=ExtendMeta(q_start[e], max(lens[i] for i in extend)),
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        k_buf = self.kv_pool.k_buffers[layer_id]  # [num_slots, Hkv, D]
        v_buf = self.kv_pool.v_buffers[layer_id]
        scales = self.kv_pool.scales(layer_id)  # an FP8 pool's exponents, else None
        meta = batch.attn_metadata
        # Over an FP8 pool the extend kernel reads the new tokens from k/v once the store
        # has written the pool's dequantized values back into them (this forward's k/v are
        # not read after attention). Decode steps (graphed or not) read every key from the
        # pool, and deterministic mode reads every key through the table: no write-back.
        write_back = (
            scales is not None
            and writes_back_exactly(k.dtype)
            and v.dtype == k.dtype
            and not isinstance(meta, (DecodeMeta, SharedPrefixMeta))
            and not self.deterministic
        )
        kv_store(k_buf, v_buf, batch.out_cache_loc, k, v, scales, write_back=write_back)
        # The fresh k/v hold exactly what the pool holds only when no cast happened, or
        # when the store wrote the FP8 pool's values back into them.
        same = k.dtype == k_buf.dtype and v.dtype == v_buf.dtype
        new_kv = (k, v) if same or write_back else None
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # [T, Hq, D]
        if isinstance(meta, SharedPrefixMeta):
            if meta.chunks is not None or self._shared_chunks(batch, meta, q):
                assert meta.chunks is not None
                launch = self.decode_launch
                config = launch if launch is not None and not launch.cuda else None
                if meta.fused:
                    return decode_attention_fused(
                        q, k_buf, v_buf, out, batch.req_to_token, batch.req_rows,
                        batch.seq_lens, self.scale, meta.chunks, config=config,
                    )  # fmt: skip
                assert meta.workspace is not None
                return decode_attention_shared(
                    q, k_buf, v_buf, out, batch.req_to_token, batch.req_rows, batch.seq_lens,
                    self.scale, meta.chunks, meta.own_splits, meta.workspace, scales=scales,
                    config=config,
                )  # fmt: skip
            meta = batch.attn_metadata = self.decode_meta(batch.batch_size, max(batch.seq_lens_cpu))
        if isinstance(meta, DecodeMeta) and self.deterministic:
            return self._decode_as_extend(q, k_buf, v_buf, out, layer_id, batch, meta, scales)
        if isinstance(meta, DecodeMeta):
            if meta.workspace is None:
                t, hq, d = q.shape
                meta.workspace = decode_workspace(t, hq, d, meta.num_splits, q.device)
            return decode_attention(
                q,
                k_buf,
                v_buf,
                out,
                batch.req_to_token,
                batch.req_rows,
                batch.seq_lens,
                self.scale,
                meta.num_splits,
                meta.workspace,
                scales=scales,
                config=self.decode_launch,
            )
        if isinstance(meta, MixedMeta):
            return self._forward_mixed(q, k_buf, v_buf, out, batch, meta, scales, new_kv)
        assert isinstance(meta, ExtendMeta), type(meta)
        return extend_attention(
            q,
            k_buf,
            v_buf,
            out,
            batch.req_to_token,
            batch.req_rows,
            batch.prefix_lens,
            batch.extend_lens,
            meta.q_start,
            meta.max_extend,
            self.scale,
            scales=scales,
            new_kv=new_kv,
            config=self.extend_cfg,
            absolute_tiles=self.deterministic,
        )

    def _decode_as_extend(
        self,
        q: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        out: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        meta: DecodeMeta,
        scales: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """Deterministic mode's decode: each row a one-token extend at its position."""
        if meta.as_extend is None:
            n = batch.seq_lens.shape[0]
            dev = batch.seq_lens.device
            ones = torch.ones(n, dtype=torch.int64, device=dev)
            meta.as_extend = (torch.empty_like(batch.seq_lens), ones, torch.arange(n, device=dev))
        prefix, ones, q_start = meta.as_extend
        if layer_id == 0:  # once a forward, inside the graph when one is captured
            torch.sub(batch.seq_lens, 1, out=prefix)
        return extend_attention(
            q,
            k_buf,
            v_buf,
            out,
            batch.req_to_token,
            batch.req_rows,
            prefix,
            ones,
            q_start,
            1,
            self.scale,
            scales=scales,
            config=self.decode_cfg,
            absolute_tiles=True,
        )

    def _forward_mixed(
        self,
        q: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        out: torch.Tensor,
        batch: ForwardBatch,
        meta: MixedMeta,
        scales: tuple[torch.Tensor, torch.Tensor] | None,
        new_kv: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> torch.Tensor:
        """Extend rows straight into `out`; decode rows gathered ([Bd, Hq, D]), decoded and
        scattered back. Every new k/v is already stored, so a decode row sees itself."""
        q_dec = q.index_select(0, meta.decode_tokens)  # [Bd, Hq, D]
        out_dec = torch.empty_like(q_dec)
        if meta.decode.workspace is None:
            bd, hq, d = q_dec.shape
            meta.decode.workspace = decode_workspace(bd, hq, d, meta.decode.num_splits, q.device)
        decode_attention(
            q_dec,
            k_buf,
            v_buf,
            out_dec,
            batch.req_to_token,
            meta.decode_req_rows,
            meta.decode_seq_lens,
            self.scale,
            meta.decode.num_splits,
            meta.decode.workspace,
            scales=scales,
            config=self.decode_launch,
        )
        extend_attention(
            q,
            k_buf,
            v_buf,
            out,
            batch.req_to_token,
            meta.extend_req_rows,
            meta.extend_prefix_lens,
            meta.extend_lens,
            meta.extend.q_start,
            meta.extend.max_extend,
            self.scale,
            scales=scales,
            new_kv=new_kv,
            config=self.extend_cfg,
        )
        return out.index_copy_(0, meta.decode_tokens, out_dec)

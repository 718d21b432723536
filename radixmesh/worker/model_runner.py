"""Runs one scheduled batch through the model and samples.

It owns the model, the KV pool, the attention backend and the sampler; the scheduler owns
which tokens go into a batch and where their KV lives (the req->token table).

`forward` never waits for the device: the sampled ids come back pending
(`batch.PendingTokens`: on the device, copied to the host behind the forward). Each step's
ids also go to a `future` buffer on the device, so a request whose last token the host has
not read yet stands for it with a placeholder id (< 0), which the next step's inputs
resolve there (the overlap scheduler launches step n+1 before it reads step n's tokens).
A plain greedy step takes one argmax in `forward`; any other draw (sampling, penalties,
grammar masks, logprobs) is left to `ForwardOutput.draw`, which the scheduler runs later
(worker/overlap.py says when). Prompt logprobs, which the host computes, wait for the
step in `forward`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from radixmesh.worker.attention.base import AttentionBackend
from radixmesh.worker.batch import (
    Batch,
    ForwardOutput,
    PendingTokens,
    PooledRows,
    PromptLogprobs,
    ScheduledRequest,
)
from radixmesh.worker.constrained.bitmask import TokenBitmask
from radixmesh.worker.constrained.manager import GrammarManager
from radixmesh.worker.forward_batch import ForwardBatch, to_device
from radixmesh.worker.kvcache.req_table import ReqToTokenTable
from radixmesh.worker.model.llama import LlamaForCausalLM
from radixmesh.worker.request import Request
from radixmesh.worker.sampler import (
    Sampler,
    SamplingRow,
    plain_greedy_params,
    reads_output_ids,
    token_logprobs,
)
from radixmesh.worker.speculative.verify import draw_drafts

if TYPE_CHECKING:  # imports triton: only where graphs are built
    from radixmesh.worker.cuda_graph import DecodeCudaGraphs


class Followers(Protocol):
    """The other ranks of rank 0's tensor-parallel group (`tp.leader.FollowerRanks`): told
    each step before rank 0 runs it, they run the same forward in lockstep."""

    def send_step(
        self, batch: Batch, fb: ForwardBatch, logit_rows: list[int], ids_on_device: bool = False
    ) -> None: ...


@dataclass
class _Rows:
    """Which hidden rows need logits: sampled rows first, then prompt-logprob rows."""

    sample_rows: list[int]
    sample_items: list[int]  # item index of each sampled row
    prompt_rows: list[int]
    prompt_targets: list[int]
    prompt_spans: list[tuple[int, int, int]]  # (item index, first scored position, count)
    # Drafting rows (speculative decoding): every one of their 1 + k rows is sampled.
    verify_rows: list[int] = field(default_factory=list)
    verify_items: list[int] = field(default_factory=list)  # item index of each such item


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        attn: AttentionBackend,
        req_table: ReqToTokenTable,
        vocab_size: int,
        grammars: GrammarManager | None = None,
        followers: Followers | None = None,
        decode_graphs: DecodeCudaGraphs | None = None,
        decode_shaped_max_rows: int = 0,
        decode_shaped_forced: bool = True,
        decode_shaped_prompt_reads: int = 0,
        keep_features: bool = False,
    ) -> None:
        """`decode_graphs`: captured on CUDA with a capture-safe backend (cuda_graph.py).
        Up to `decode_shaped_max_rows` tokens (the worker gives the largest graph), a step
        whose multi-token rows are jump-forward's forced tokens (with
        `decode_shaped_forced`) or short prompt chunks (within `decode_shaped_prompt_reads`)
        runs as one decode row per token; see `_decode_shaped`. 0: never. The three stay
        switches a caller may flip between steps (ablations). `keep_features`
        (speculative='eagle'): each step whose batch keeps features (`Batch.keep_features`,
        which the scheduler clears for a step that cannot draft) hands back the final
        hidden rows of the requests that may draft (`ForwardOutput.features`); otherwise
        no copy is made."""
        self.model = model
        self.keep_features = keep_features
        self.decode_shaped_max_rows = decode_shaped_max_rows
        self.decode_shaped_forced = decode_shaped_forced
        self.decode_shaped_prompt_reads = decode_shaped_prompt_reads
        self.num_decode_shaped_steps = 0
        # Rank 0 of a TP group: the other ranks run every forward with this one.
        self.followers = followers
        self.attn = attn
        self.req_table = req_table
        self.sampler = Sampler(vocab_size)
        self.grammars = grammars
        self.decode_graphs = decode_graphs
        # Two steps' sampled ids (parity 0 and 1: one is read back while the next runs),
        # each at most one per table row; index 0 unused, so every placeholder is < 0.
        rows = req_table.max_requests
        device = req_table.table.device
        self.future = torch.zeros(1 + 2 * rows, dtype=torch.int64, device=device)
        self._host: list[torch.Tensor] = []
        if device.type == "cuda":
            self._host = [torch.empty(rows, dtype=torch.int64, pin_memory=True) for _ in "01"]
        self._parity = 0

    @torch.inference_mode()
    def forward(self, batch: Batch) -> ForwardOutput:
        fb, pending_inputs = self._forward_batch(batch)
        rows = self._rows(batch)
        all_rows = rows.sample_rows + rows.verify_rows + rows.prompt_rows
        # Every row of a decode step, in order (each plain row samples, a drafting row's
        # all verify): the logits take the hidden rows as they are, with no index to copy
        # to the device and gather by. Otherwise the index is copied before the forward is
        # launched: on CUDA a blocking copy would wait for the whole forward, and the host
        # work after the launch (the grammar bitmask above all, see _sample) could no
        # longer overlap the GPU.
        every_row = len(all_rows) == len(fb.input_ids) and all_rows == list(range(len(all_rows)))
        index = (
            None
            if every_row
            else to_device(torch.tensor(all_rows, dtype=torch.int64), self.future.device)
        )
        if self.followers is not None:  # placeholders: they get the resolved ids too
            self.followers.send_step(batch, fb, all_rows, ids_on_device=pending_inputs)
        if self.decode_graphs is not None and self.decode_graphs.can_run(fb):
            hidden = self.decode_graphs.run(fb)  # [B, hidden]
        else:
            self.attn.prepare(fb)
            hidden = self.model(fb, self.attn)  # [T, hidden]
        out = ForwardOutput.empty(len(batch.items))
        out.hidden = _pooled(batch.items, hidden)
        if self.keep_features and batch.keep_features:
            out.features = _features(batch.items, hidden)
        if not all_rows:
            return out
        wanted = hidden if index is None else hidden.index_select(0, index)
        logits = self.model.compute_logits(wanted)  # [N, V] fp32
        n_sample, n_verify = len(rows.sample_rows), len(rows.verify_rows)
        if n_sample:
            self._sample(batch.items, rows, logits[:n_sample], out)
        if n_verify:
            self._verify(batch.items, rows, logits[n_sample : n_sample + n_verify], out)
        if rows.prompt_rows:
            self._prompt_logprobs(batch.items, rows, logits[n_sample + n_verify :], out)
        return out

    def _forward_batch(self, batch: Batch) -> tuple[ForwardBatch, bool]:
        """The step's ForwardBatch, its placeholders resolved from `future` on the device,
        and whether it had any. The req->token table's device copy is brought up to date
        first (its staged writes: kvcache/req_table.py), as the step reads it; they go to
        the device in the batch's one copy of its inputs (ForwardBatch.build)."""
        staged = self.req_table.take_staged()
        items = batch.items
        prefix_lens = [item.req.num_computed_tokens for item in items]
        input_ids: list[int] = []
        for item, start in zip(items, prefix_lens, strict=True):
            n, ids = item.num_new_tokens, item.req.token_ids
            if n == 1:  # decode: no slice (a list copy) for one id
                input_ids.append(ids[start])
            elif item.draft:  # the last token, then the drafts after it
                input_ids.append(ids[start])
                input_ids.extend(item.draft)
            else:
                input_ids.extend(ids[start : start + n])
        req_rows: list[int] = [item.req.row for item in items]  # type: ignore[misc]
        extend_lens = [item.num_new_tokens for item in items]
        if len(input_ids) > len(items) and self._decode_shaped(items, prefix_lens, input_ids):
            req_rows, prefix_lens, extend_lens = _one_row_per_token(
                req_rows, prefix_lens, extend_lens
            )
            self.num_decode_shaped_steps += 1
        fb = ForwardBatch.build(
            input_ids=input_ids,
            out_cache_loc=batch.out_cache_loc,
            req_rows=req_rows,
            prefix_lens=prefix_lens,
            extend_lens=extend_lens,
            req_to_token=self.req_table.table,
            carry=staged,
        )
        if fb.carried is not None:
            self.req_table.apply_staged(fb.carried)
        if self.followers is None:  # followers have no mirror: every rank runs one path
            fb.req_to_token_host = self.req_table.host_array
        pending = bool(input_ids) and min(input_ids) < 0
        if pending:  # resolved in place: `decode_inputs` holds the same ids
            given = fb.input_ids
            given.copy_(torch.where(given < 0, self.future[given.neg().clamp_(min=0)], given))
        return fb, pending

    def _decode_shaped(
        self, items: list[ScheduledRequest], prefix_lens: list[int], input_ids: list[int]
    ) -> bool:
        """Whether a step with multi-token rows runs as decode rows, one per new token.

        New token i of a row that extends from `prefix` is exactly a decode row of the
        same request with `prefix + i` tokens before it: every layer writes the KV of all
        the step's tokens before its attention reads any, so that row sees keys 0 ..
        prefix + i, the causal extend. A decode-shaped step replays the decode CUDA graph
        (a mixed one cannot: on the H200 it cost 34 ms against 14 ms for a graph step,
        with jump-forward putting forced tokens in ~93% of steps). Without graphs it does
        not pay: on the CPU torch backend the padded attention over every row made the
        JSON benchmark's jump-forward steps slower, so the worker enables it with graphs.

        Which multi-token rows qualify: jump-forward's forced output tokens (a handful
        each; `decode_shaped_forced`), and prompt chunks as long as the step's chunks read
        at most `decode_shaped_prompt_reads` keys in all (token i of a chunk from prefix p
        reads p + i + 1 keys, where the extend kernel reads each key once per tile). So
        admitting a short prompt beside running requests replays the graph too; on the
        H200 an eager admission step of the JSON workload cost ~45 ms against ~13 ms for
        a graph step (bench/step_anatomy.py). The decode kernel sums a row's keys in
        another order than the extend kernel: the same math, not the same bits. At most
        `decode_shaped_max_rows` tokens in all. Not with tensor-parallel followers: their
        step header is per request.
        """
        if len(input_ids) > self.decode_shaped_max_rows or self.followers is not None:
            return False
        budget = self.decode_shaped_prompt_reads
        for item, start in zip(items, prefix_lens, strict=True):
            n = item.num_new_tokens
            if n == 1:
                continue
            if start < item.req.num_prompt_tokens:  # a prompt chunk
                budget -= n * start + n * (n + 1) // 2
                if budget < 0:
                    return False
            elif not self.decode_shaped_forced:
                return False
        return True

    @staticmethod
    def _rows(batch: Batch) -> _Rows:
        rows = _Rows([], [], [], [], [])
        offset = 0
        for i, item in enumerate(batch.items):
            req, n = item.req, item.num_new_tokens
            # Inlined `item.samples` and `req.remaining_new_tokens`: this runs per request
            # per step, and the properties cost more than the arithmetic.
            computed, params = req.num_computed_tokens, req.params
            if item.draft:
                rows.verify_rows.extend(range(offset, offset + n))
                rows.verify_items.append(i)
            elif computed + n == len(req.token_ids) and (
                params.max_new_tokens > len(req.token_ids) - req.num_prompt_tokens
            ):
                rows.sample_rows.append(offset + n - 1)
                rows.sample_items.append(i)
            if params.return_logprob and params.logprob_start_len is not None:
                _add_prompt_rows(rows, i, item, offset)  # req.wants_prompt_logprobs
            offset += n
        return rows

    def _sample(
        self, items: list[ScheduledRequest], rows: _Rows, logits: torch.Tensor, out: ForwardOutput
    ) -> None:
        reqs = [items[i].req for i in rows.sample_items]
        # Rows whose params are all plain greedy (each params object checked once: a
        # batch's requests often share one) take the argmax that `draw` would, without a
        # SamplingRow per row (at 256 rows ~0.45 against ~0.6-0.9 ms a step on the CPU).
        items_sampled = rows.sample_items
        constrained = self.grammars is not None and any(r.grammar is not None for r in reqs)
        if not constrained and all(
            map(plain_greedy_params, {id(r.params): r.params for r in reqs}.values())
        ):
            out.tokens = self._pending(self.sampler.argmax(logits).token_ids, items_sampled)
            return
        # Any other draw is deferred (`ForwardOutput.draw`): on CUDA it waits for the
        # forward, and the overlap scheduler builds the next step before running it. The
        # rows are read now, as the requests stand at the launch; the placeholders' half
        # of `future` is taken now too, in launch order. A row whose rules read its output
        # (penalties, min_new_tokens) counts as many output tokens as it has now, and
        # reads their ids when it draws: by then the overlap scheduler has read the
        # previous step's token, which was still a placeholder at the launch. So does a
        # constrained row's mask: its grammar has accepted that token then (and any text
        # jump-forward appended after it, which voids this row: see `_allowed`).
        sampling_rows = [_sampling_row(r, ()) for r in reqs]
        reading = [
            (j, r.num_output_tokens) for j, r in enumerate(reqs) if reads_output_ids(r.params)
        ]
        base = self._take_half()
        out.tokens = PendingTokens(items_sampled, _NO_IDS, _NO_IDS, None, base)

        def draw() -> None:
            for j, n in reading:
                sampling_rows[j].output_ids = _output_at_draw(reqs[j], n)
            allowed = self._allowed(reqs, base, logits.device) if constrained else None
            res = self.sampler.draw(logits, sampling_rows, allowed=allowed)
            out.tokens = self._publish(res.token_ids, items_sampled, base)
            if res.logprobs is None and res.top_logprobs is None:
                return
            for j, i in enumerate(items_sampled):
                if res.logprobs is not None:
                    out.logprobs[i] = res.logprobs[j]
                if res.top_logprobs is not None:
                    out.top_logprobs[i] = res.top_logprobs[j]

        out.pending_draw = draw

    def _verify(
        self, items: list[ScheduledRequest], rows: _Rows, logits: torch.Tensor, out: ForwardOutput
    ) -> None:
        """Drafting rows' draws (speculative/verify.py), left on the device: their
        outcomes are read back by `out.read_verified()`, which waits for the step, so a
        step with drafting rows is synchronous (the overlap scheduler runs it so), but
        the caller's host work before that call overlaps the device."""
        drafts = [items[i] for i in rows.verify_items]
        drawn = draw_drafts(
            self.sampler,
            logits,
            [_sampling_row(item.req) for item in drafts],
            [item.draft for item in drafts],
            [item.draft_mask for item in drafts],
        )
        verify_items = rows.verify_items
        out.pending_verified = lambda: list(zip(verify_items, drawn.outcomes(), strict=True))

    def _pending(self, ids: torch.Tensor, sample_items: list[int]) -> PendingTokens:
        """`ids` ([N] on the device) into this step's half of `future`, and to the host
        behind the forward (an event marks the copy's end)."""
        return self._publish(ids, sample_items, self._take_half())

    def _take_half(self) -> int:
        """The next step's half of `future` (they alternate): its placeholders' base."""
        parity, self._parity = self._parity, self._parity ^ 1
        return 1 + parity * self.req_table.max_requests

    def _publish(self, ids: torch.Tensor, sample_items: list[int], base: int) -> PendingTokens:
        """`_pending` into the half at `base`."""
        n = len(sample_items)
        self.future[base : base + n] = ids
        if not self._host:
            return PendingTokens(sample_items, ids, ids, None, base)
        host = self._host[(base - 1) // self.req_table.max_requests][:n]
        host.copy_(ids, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return PendingTokens(sample_items, ids, host, event, base)

    def _allowed(self, reqs: list[Request], base: int, device: torch.device) -> TokenBitmask | None:
        """One bitmask for the constrained rows only; None (no cost) when there are none.
        On CUDA it is filled in pinned memory, so its copy to the GPU does not block.
        Sampled row j still stands as its placeholder -(base + j) at its request's end,
        unless the row is void: the request ended since the launch, or a jump-forward
        under the overlap scheduler put forced text where the row's token would go
        (`Scheduler._jumped_under_a_step`). A void row's token is dropped, so it takes no
        mask (its grammar is past the row's position)."""
        rows = [
            j
            for j, r in enumerate(reqs)
            if r.grammar is not None and r.finish_reason is None and r.token_ids[-1] == -(base + j)
        ]
        if not rows or self.grammars is None:
            return None
        bits = self.grammars.fill_bitmask([reqs[j] for j in rows], pin=device.type == "cuda")
        return TokenBitmask(bits, rows)

    def _prompt_logprobs(
        self, items: list[ScheduledRequest], rows: _Rows, logits: torch.Tensor, out: ForwardOutput
    ) -> None:
        targets = torch.tensor(rows.prompt_targets, dtype=torch.int64, device=logits.device)
        k = max(items[i].req.params.top_logprobs_num for i, _, _ in rows.prompt_spans)
        lps, tops = token_logprobs(logits, targets, k)
        at = 0
        for i, first, count in rows.prompt_spans:
            top_n = items[i].req.params.top_logprobs_num
            out.prompt_logprobs[i] = PromptLogprobs(
                first=first,
                logprobs=[float(x) for x in lps[at : at + count]],
                top=[t[:top_n] for t in tops[at : at + count]] if tops else [],
            )
            at += count


def _pooled(items: list[ScheduledRequest], hidden: torch.Tensor) -> list[PooledRows | None]:
    """The rows embedding requests want from this step's `[T, hidden]` final hidden
    states, pooled on the device (one sum or row each, not the rows)."""
    out: list[PooledRows | None] = [None] * len(items)
    offset = 0
    for i, item in enumerate(items):
        req, n = item.req, item.num_new_tokens
        pool = req.hidden_pool
        if pool is not None:
            lo, hi = pool.wanted(item.start, n, req.num_tokens)
            if hi > lo:
                rows = hidden[offset + lo : offset + hi].float()  # [k, hidden]
                out[i] = PooledRows(item.start + lo, hi - lo, rows.sum(dim=0))
        offset += n
    return out


def _features(items: list[ScheduledRequest], hidden: torch.Tensor) -> list[torch.Tensor | None]:
    """Every new row of the items whose request may draft, [n, hidden] each: copies (one
    gather), since a decode graph's output buffer is overwritten by its next replay. A
    drafting row's are all 1 + k positions: the scheduler keeps the accepted ones."""
    out: list[torch.Tensor | None] = [None] * len(items)
    wanted: list[int] = []
    index: list[int] = []
    offset = 0
    for i, item in enumerate(items):
        req, n = item.req, item.num_new_tokens
        if req.params.speculative and req.hidden_pool is None and n:
            wanted.append(i)
            index.extend(range(offset, offset + n))
        offset += n
    if not wanted:
        return out
    at = torch.tensor(index, dtype=torch.int64).to(hidden.device, non_blocking=True)
    rows = hidden.index_select(0, at).split([items[i].num_new_tokens for i in wanted])
    for i, r in zip(wanted, rows, strict=True):
        out[i] = r
    return out


def _one_row_per_token(
    req_rows: list[int], prefix_lens: list[int], extend_lens: list[int]
) -> tuple[list[int], list[int], list[int]]:
    """Split each row of n new tokens into n one-token rows at prefixes p, p+1, ..., in
    token order (input_ids, out_cache_loc and the hidden rows keep their layout)."""
    rows: list[int] = []
    prefixes: list[int] = []
    for row, p, n in zip(req_rows, prefix_lens, extend_lens, strict=True):
        if n == 1:
            rows.append(row)
            prefixes.append(p)
        else:
            rows.extend([row] * n)
            prefixes.extend(range(p, p + n))
    return rows, prefixes, [1] * len(rows)


# A deferred draw's ids until it runs (`ForwardOutput.draw` replaces them).
_NO_IDS = torch.empty(0, dtype=torch.int64)


def _sampling_row(req: Request, output_ids: Sequence[int] | None = None) -> SamplingRow:
    """`output_ids`: None for the request's own (a fresh list slice, built only when a
    rule reads them)."""
    params = req.params
    if output_ids is None:
        output_ids = req.output_ids if reads_output_ids(params) else ()
    return SamplingRow(
        params=params,
        prompt_ids=req.prompt_ids,
        output_ids=output_ids,
        stop_ids=req.stop_ids,
        generator=req.generator,
    )


def _output_at_draw(req: Request, n: int) -> Sequence[int]:
    """The first n output ids of `req`, for a draw deferred past its launch (`_sample`).
    Every one is on the host by then, unless the request ended since (its token is
    dropped, so no rule needs its ids: none are given)."""
    if req.finish_reason is not None:
        return ()
    start = req.num_prompt_tokens
    ids = req.token_ids[start : start + n]
    if ids and min(ids) < 0:
        raise RuntimeError(f"request {req.rid}: an output token was still on the device")
    return ids


def _add_prompt_rows(rows: _Rows, i: int, item: ScheduledRequest, offset: int) -> None:
    """Position p's logits score token p+1; score prompt tokens from logprob_start_len on."""
    req = item.req
    first_scored = max(req.params.logprob_start_len or 0, 1)
    lo = max(item.start, first_scored - 1)
    hi = min(item.start + item.num_new_tokens, req.num_prompt_tokens - 1)
    if hi <= lo:
        return
    for p in range(lo, hi):
        rows.prompt_rows.append(offset + (p - item.start))
        rows.prompt_targets.append(req.token_ids[p + 1])
    rows.prompt_spans.append((i, lo + 1, hi - lo))

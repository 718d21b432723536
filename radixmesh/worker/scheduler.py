"""Continuous batching over the radix cache: `step()` = schedule -> launch -> process_output.

One step, in three parts: `schedule` builds a batch; `launch` runs the model runner's
forward on it (which does not wait for the device) and moves the counters, leaving each
sampled request a placeholder token; `process_output` reads the step's tokens back and
does the rest (stop checks, text, streaming, finishing). `step` runs them in that order;
the overlap scheduler (overlap.py) runs the next step's schedule and launch before this
step's process_output.

Each step has a token budget (`max_num_batched_tokens`). Running requests go first, in
admission order: one token each when decoding, a chunk of the remaining prompt when a
prefill was cut (chunked prefill). What budget is left admits waiting requests, in the
policy's order: each one's longest cached prefix is locked in the radix cache and only
the uncached suffix is computed.

Host memory (a `HostTier` under the radix cache): a prompt whose cached prefix continues
in host memory gets it copied back at admission, when the device has room for it and the
request, instead of computing it again (`_reload`). On CUDA the copy runs beside the
forwards, and the request (with any other whose prefix runs into it) waits in the queue
until it is done: steps go on meanwhile, none waits for it.

Memory: admission reserves room for each request's future tokens
(`new_token_ratio` x its remaining max_new_tokens); when a step still cannot get slots,
the cache evicts unlocked leaves, and if that is not enough the newest running request is
retracted (its computed tokens go into the cache, its output is kept, and it is requeued
at the front), so the older ones finish.

Slot ownership, the invariant tests assert after every step:
free slots + slots in the radix tree + slots held only by running requests == usable slots.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Protocol

import torch

from radixmesh.worker.batch import (
    Batch,
    Draft,
    ForwardOutput,
    Launched,
    PromptLogprobs,
    ScheduledRequest,
)
from radixmesh.worker.config import SchedulerConfig
from radixmesh.worker.constrained.manager import GrammarManager
from radixmesh.worker.kvcache.allocator import KVAllocator
from radixmesh.worker.kvcache.radix_cache import RadixCache
from radixmesh.worker.kvcache.req_table import ReqToTokenTable
from radixmesh.worker.kvcache.tree_node import MatchResult, TreeNode
from radixmesh.worker.output import OutputProcessor
from radixmesh.worker.overlap import OverlapLoop
from radixmesh.worker.policy import create_policy
from radixmesh.worker.request import FinishReason, Request
from radixmesh.worker.request_slots import RequestSlots
from radixmesh.worker.speculative.speculator import Speculator
from radixmesh.worker.stats import SchedulerStats
from radixmesh.worker.step_prefixes import StepPrefixes


class ModelRunnerLike(Protocol):  # the one method the scheduler needs (model_runner.py)
    def forward(self, batch: Batch) -> ForwardOutput: ...


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        *,
        cache: RadixCache,
        allocator: KVAllocator,
        req_table: ReqToTokenTable,
        runner: ModelRunnerLike,
        output: OutputProcessor,
        page_size: int = 1,
        grammars: GrammarManager | None = None,
        align: int = 1,
        speculator: Speculator | None = None,
    ) -> None:
        """`align` > 1 (deterministic mode, worker/deterministic.py): cached prefixes are
        matched, and prefill chunks cut, only at multiples of it (and of page_size).
        `speculator`: decoding requests draft tokens that their step verifies
        (worker/speculative/; page_size 1)."""
        self.config = config
        self.cache = cache
        self.allocator = allocator
        self.req_table = req_table
        self.runner = runner
        self.output = output
        self.page_size = page_size
        self.grammars = grammars
        self.speculator = speculator
        self.policy = create_policy(config.policy, cache, config.policy_fallback_queue_len)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.slots = RequestSlots(allocator, cache, req_table, page_size)
        self._host_bound: list[Request] = []  # unfinished requests that need synchronous steps
        self._prompt_tokens = 0
        self._cache_hit_tokens = 0
        self._host_hit_tokens = 0
        self._generated_tokens = 0
        self._num_retractions = 0
        self._num_aborted = 0
        self._num_steps = 0
        self._overlap = OverlapLoop(self) if config.overlap_schedule else None
        self._threshold = config.in_batch_prefix_threshold
        self._align = math.lcm(align, page_size) if align > 1 else 1

    # ---- the loop -------------------------------------------------------------------

    def step(self) -> list[Request]:
        """One iteration. Returns the requests that finished in it."""
        if self._overlap is not None:
            return self._overlap.step()
        return self.step_sync()

    def step_sync(self) -> list[Request]:
        """schedule -> launch -> process_output, with nothing else in flight."""
        batch = self.schedule()
        if batch is None:
            return []
        return self.process_output(self.launch(batch))

    def has_work(self) -> bool:
        inflight = self._overlap is not None and self._overlap.inflight is not None
        # Trimmed slots not yet given back: one more (empty) schedule frees them.
        return bool(self.waiting or self.running or inflight or self.slots.num_trimmed)

    def needs_host_tokens(self) -> bool:
        """Whether the next step reads the previous token on the host: a step that may
        draft (its drafts follow the last token), and with page_size > 1 a constrained
        request's (a jump-forward under a step in flight may hand back the KV slot of a
        token it retokenized, which a page cannot). The overlap scheduler steps
        synchronously while one is. Nothing else does: grammars, penalties,
        min_new_tokens and logprobs read what they need in the deferred draw, which runs
        once the previous step's token is on the host (overlap.py)."""
        if self._host_bound:
            self._host_bound = [r for r in self._host_bound if not r.finished]
        if self.speculator is not None and self.speculator.may_draft(self.running):
            return True
        return bool(self._host_bound)

    # ---- requests in and out --------------------------------------------------------

    def add_request(self, req: Request) -> None:
        if self.grammars is not None:
            self.grammars.attach(req)  # starts (or finds) its compile; admission waits
        if req.grammar is not None and self.page_size > 1:
            self._host_bound.append(req)
        self.waiting.append(req)

    def abort(self, rid: str, reason: str = "aborted") -> bool:
        """Abort a waiting or running request; its slots are back before this returns."""
        for req in self.waiting:
            if req.rid == rid:
                self.waiting.remove(req)
                self._finish_abort(req, reason)
                return True
        for req in self.running:
            if req.rid == rid:
                self.running.remove(req)
                self.slots.release(req)
                self._finish_abort(req, reason)
                return True
        return False

    def abort_all(self, reason: str) -> None:
        for req in [*self.waiting, *self.running]:
            self.abort(req.rid, reason)

    def fail_all(self, reason: str) -> None:
        """After a step raised: the step's KV writes may be partial, so nothing of a
        running request goes into the cache; its own slots are freed and its lock dropped."""
        if self._overlap is not None:
            self._overlap.inflight = None  # its tokens are not needed: all are aborted
        for req in list(self.running):
            self.running.remove(req)
            self.slots.discard(req)
            self._finish_abort(req, reason)
        self.abort_all(reason)

    # ---- schedule -------------------------------------------------------------------

    def schedule(self) -> Batch | None:
        """The next step's batch. Slots stay on the host (each part's bookkeeping reads
        them there; a copy per admitted request was a pinned copy and a wait-free
        transfer each on CUDA): the runner moves them to the device with the step's other
        inputs and the req->token table's staged writes, in one copy."""
        budget = self.config.token_budget
        items: list[ScheduledRequest] = []
        slots: list[torch.Tensor] = []  # [n_i] int64 on the host, in item order
        running = self._to_run()
        drafts = self.speculator.drafts(running) if self.speculator is not None else None
        if not self._schedule_decode(running, budget, items, slots, drafts):
            self._schedule_running(running, budget, items, slots)
        budget -= sum(item.num_new_tokens for item in items)
        if budget > 0:
            self._admit(budget, items, slots)
            if not items and self.cache.tier is not None and self.cache.poll_loads():
                # Nothing runs but prompts waiting for their reloads: wait for those.
                self.cache.poll_loads(wait=True)
                self._admit(budget, items, slots)
        if not items:
            self.slots.free_trimmed()  # idle: nothing to overlap with
            return None
        host = slots[0] if len(slots) == 1 else torch.cat(slots)
        spec = self.speculator  # without one, the runner's own switch alone decides
        keep = spec is None or spec.keeps_features(item.req for item in items)
        return Batch(items=items, out_cache_loc=host, keep_features=keep)

    def _to_run(self) -> list[Request]:
        """The running requests that take a row this step. Under overlap, a request whose
        pending token (still on the device) is its last by max_new_tokens ends when that
        step is read, whatever the token: another row would compute one more token only to
        drop it, and keep its slot and its place in the batch a step longer. Such a request
        ends as it would in a synchronous step, its last token without KV. The same for the
        context length. (An EOS or a stop string cannot be known ahead, and is noticed one
        step late: overlap.py.) A request whose last token is on the host has none pending
        (a prompt still being computed, chunk by chunk, max_new_tokens 0 ones included)."""
        running = self.running
        if self._overlap is None or self._overlap.inflight is None:
            return running  # a synchronous step has read every token: none is pending
        ctx = self.output.context_len
        return [
            r
            for r in running
            if r.token_ids[-1] >= 0
            or (r.params.max_new_tokens > r.num_output_tokens and len(r.token_ids) < ctx)
        ]

    def _schedule_running(
        self,
        running: list[Request],
        budget: int,
        items: list[ScheduledRequest],
        slots: list[torch.Tensor],
    ) -> None:
        """Running requests in admission order, one allocation each (retracting if short)."""
        for req in list(running):
            if budget == 0:
                break
            if req not in self.running:  # retracted while making room for an older one
                continue
            n = self._chunk(req.num_computed_tokens, req.num_tokens, budget)
            if n == 0:
                continue  # an aligned chunk does not fit what is left of the budget
            new = self._alloc_or_retract(req, n)
            if new is None:
                continue  # `req` itself was retracted
            items.append(ScheduledRequest(req, n))
            slots.append(new)
            budget -= n

    def _schedule_decode(
        self,
        running: list[Request],
        budget: int,
        items: list[ScheduledRequest],
        slots: list[torch.Tensor],
        drafts: dict[Request, Draft] | None = None,
    ) -> bool:
        """The common step where every running request decodes one token, batched.

        Allocates every row's slot in one call and writes them into the table in one
        indexed write: per-request calls cost ~10 us each, ~3 ms a step at batch 256 (and
        on CUDA a copy and a sync each). With page_size 1 a row may also take several
        tokens (the forced tokens of a jump-forward, the rest of a prompt), as long as all
        of them fit the budget. The result is what `_schedule_running` would give when
        memory suffices. Returns False, having allocated nothing, when this is not such a
        step or memory is short; the per-request path then evicts and retracts as before.
        Drafting rows (`drafts`, speculative decoding) take their drafts' slots here too;
        the per-request path runs without drafts (memory is short there).
        """
        if not running or len(running) > budget:
            return False
        counts = [r.num_tokens - r.num_computed_tokens for r in running]
        if drafts:
            counts = [
                c + (len(drafts[r].tokens) if r in drafts else 0)
                for r, c in zip(running, counts, strict=True)
            ]
        total = sum(counts)
        # Only with pages does the last slot matter: a row mid-page takes the next one.
        by_page = self.page_size > 1
        if total > budget or min(counts) < 1 or (by_page and total != len(running)):
            return False
        new = self.slots.alloc_decode(running, counts)
        if new is None:
            return False
        if drafts:
            for r, k in zip(running, counts, strict=True):
                d = drafts.get(r)
                items.append(
                    ScheduledRequest(r, k)
                    if d is None
                    else ScheduledRequest(r, k, d.tokens, d.mask)
                )
        else:
            items.extend(ScheduledRequest(r, k) for r, k in zip(running, counts, strict=True))
        slots.append(new)
        return True

    def _admit(self, budget: int, items: list[ScheduledRequest], slots: list[torch.Tensor]) -> None:
        """Admit waiting requests in the policy's order while budget, rows and memory last.

        A request that would compute a prefix another one admitted in this step computes
        waits a step instead (step_prefixes.py), cheaply: with a long queue most of a
        step's candidates may be such requests. At most `admission_match_limit` requests
        are prefix-matched and then passed over per step; past that the step stops looking
        down the queue, so a step's admission time is bounded whatever waits.
        """
        if self.cache.tier is not None:
            self.cache.poll_loads()
        full = len(self.running) >= self.config.running_cap
        if not self.waiting or full or self.req_table.num_free_rows == 0:
            return  # nothing can be admitted: don't pay for the policy's prefix matching
        reserved = self._reserved_tokens()
        step = None if self.cache.disabled else StepPrefixes(self._threshold, self.page_size)
        passed_over = 0
        admitted: set[Request] = set()
        for req in self.policy.order(list(self.waiting)):
            if budget == 0 or len(self.running) >= self.config.running_cap:
                break
            if self._grammar_not_ready(req):
                continue
            if req.token_ids[-1] < 0:
                continue  # retracted while its last token was on the device (overlap.py)
            if step is not None and step.defers_without_match(req):
                continue  # next step it hits the prefix this step computes
            match = self.cache.match_prefix(req.token_ids, end=req.max_prefix_match())
            if match.host_nodes:
                match = self._reload(req, match, reserved)
            if match.pending:
                continue  # its prefix is on its way back from host memory
            if len(match.slots) % self._align:  # deterministic mode: an aligned prefix
                aligned = len(match.slots) - len(match.slots) % self._align
                match = self.cache.match_prefix(req.token_ids, end=aligned, count_stats=False)
            if step is not None and step.defers(req, match.last_node):
                passed_over += 1
                if passed_over >= self.config.admission_match_limit:
                    break
                continue
            row = self.req_table.alloc_row()
            if row is None:
                break
            self.cache.inc_lock_ref(match.last_node)
            need = self._future_need(req, len(match.slots))
            if need > self._available() - reserved:
                self.cache.dec_lock_ref(match.last_node)
                self.req_table.free_row(row)
                break  # keep the policy's order: no smaller request jumps ahead
            prefix = len(match.slots)
            n = self._chunk(prefix, req.num_tokens, budget)
            host = self.slots.alloc(n, num_existing=prefix, last_slot=None) if n else None
            if host is None:  # reservation is an estimate; memory is the truth
                self.cache.dec_lock_ref(match.last_node)
                self.req_table.free_row(row)
                break
            self._start(req, row, match.slots, match.last_node)
            new = self.slots.record(req, row, prefix, host)
            self.running.append(req)
            admitted.add(req)
            if step is not None:
                step.add(req, match.last_node)
            items.append(ScheduledRequest(req, n))
            slots.append(new)
            budget -= n
            reserved += need
        if admitted:  # one pass over the queue, not a scan per admitted request
            kept = [r for r in self.waiting if r not in admitted]
            self.waiting.clear()
            self.waiting.extend(kept)

    def _chunk(self, start: int, end: int, budget: int) -> int:
        """Tokens start .. end to compute this step within `budget`: all of them, or a
        chunk that ends at a multiple of the alignment (0 when none fits)."""
        n = min(end - start, budget)
        if n == end - start or self._align == 1:
            return n
        return max(0, (start + n) // self._align * self._align - start)

    def _grammar_not_ready(self, req: Request) -> bool:
        """Skip a request whose grammar still compiles; finish one whose compile failed.
        A ready one gets the text its grammar forces at the start (jump-forward)."""
        if self.grammars is None or req.grammar is None:
            return False
        if self.grammars.pending(req):
            return True
        if req.grammar.error is not None:
            self.waiting.remove(req)
            self._finish_abort(req, req.grammar.error)
            return True
        self.grammars.jump_at_start(req, self.output)  # once: the text forced at the start
        if req.finished:  # max_new_tokens or a stop string inside that text
            self.waiting.remove(req)
            self.output.emit(req)
            return True
        return False

    def _reload(self, req: Request, match: MatchResult, reserved: int) -> MatchResult:
        """A prefix that continues in host memory, copied back to the device when the
        device can hold it and what the request needs after it (else the device's part)."""
        host = match.host_tokens
        need = self._future_need(req, len(match.slots) + host) + host
        if need > self._available() - reserved:
            return match
        loaded = self.cache.load_host(match)
        if loaded is not match:
            req.reloaded_tokens += host
        return loaded

    def _start(self, req: Request, row: int, prefix_slots: torch.Tensor, node: TreeNode) -> None:
        req.row = row
        req.last_node = node
        req.num_shared_tokens = len(prefix_slots)
        req.num_computed_tokens = len(prefix_slots)
        if len(prefix_slots):
            self.req_table.write(row, 0, prefix_slots)
        if not req.admitted:  # count a prompt's cache hit once, not again after retraction
            req.admitted = True
            req.admit_time = time.monotonic()
            # The match may run past the prompt into output tokens a grammar forced (a
            # required tool call's opening text) that an earlier request cached: only the
            # prompt's part is a prompt cache hit.
            hit = min(len(prefix_slots), req.num_prompt_tokens)
            req.num_cached_tokens = hit
            req.num_host_cached_tokens = min(req.reloaded_tokens, hit)
            self._host_hit_tokens += req.num_host_cached_tokens
            self._prompt_tokens += req.num_prompt_tokens
            self._cache_hit_tokens += hit

    def _future_need(self, req: Request, prefix: int) -> int:
        future = int(req.remaining_new_tokens * self.config.new_token_ratio)
        return req.num_tokens - prefix + future + self.page_size

    def _reserved_tokens(self) -> int:
        ratio = self.config.new_token_ratio
        return sum(
            (r.num_tokens - r.num_computed_tokens) + int(r.remaining_new_tokens * ratio)
            for r in self.running
        )

    def _available(self) -> int:
        free = self.allocator.num_free_slots + self.slots.num_trimmed
        return free + self.cache.evictable_size()

    # ---- slots ----------------------------------------------------------------------

    def _alloc_or_retract(self, req: Request, n: int) -> torch.Tensor | None:
        """Slots for `req`'s next n tokens, retracting newer requests if memory is short."""
        while True:
            host = self.slots.alloc_next(req, n)
            if host is not None:
                return host
            victim = self.running[-1]
            self.retract(victim)
            if victim is req:
                return None

    def retract(self, req: Request) -> None:
        """Preempt a running request: keep its output, return its slots, requeue it first."""
        self.running.remove(req)
        self.slots.release(req)
        req.num_computed_tokens = 0
        req.num_retractions += 1
        self._num_retractions += 1
        self.waiting.appendleft(req)

    # ---- launch and process_output ------------------------------------------------------

    def launch(self, batch: Batch) -> Launched:
        """Run the forward (it does not wait for the device) and move the counters: each
        item's computed tokens, a prompt chunk into the tree for others to reuse, and a
        placeholder for each sampled token until `process_output` reads it."""
        items = batch.items
        out = self.runner.forward(batch)
        # While the device computes: the last verify step's rejected slots back to the
        # allocator, then this step's drafting rows' outcomes (which wait for it).
        self.slots.free_trimmed()
        out.read_verified()
        self._num_steps += 1
        samples: list[bool] = []
        for i, item in enumerate(items):
            req = item.req
            start = req.num_computed_tokens
            if item.draft:  # verified in the forward: keep the accepted drafts' KV only
                verified = out.verified[i]
                assert verified is not None
                req.num_computed_tokens = start + 1 + verified.accepted
                self.slots.trim(req, req.num_computed_tokens)
                if self.speculator is not None:
                    self.speculator.record(req, len(item.draft), verified.accepted)
                    self._observe(req, start, out, i)
                samples.append(False)
                continue
            samples.append(start + item.num_new_tokens == len(req.token_ids))
            req.num_computed_tokens = start + item.num_new_tokens
            if out.features and self.speculator is not None:
                self._observe(req, start, out, i)
            # Forced output tokens (jump-forward) stay out of the tree, like decoded ones
            # (~2% of a jump-forward step).
            if item.num_new_tokens > 1 and start < req.num_prompt_tokens:
                self.slots.share_prefix(req)
        positions: list[int] = []
        base = out.tokens.base  # placeholder(j) is -(base + j)
        for j, i in enumerate(out.tokens.sample_items):
            ids = items[i].req.token_ids
            positions.append(len(ids))
            ids.append(-(base + j))
        return Launched(batch, out, samples, positions)

    def _observe(self, req: Request, start: int, out: ForwardOutput, i: int) -> None:
        """The target's features of the positions the request keeps (a drafting row's
        accepted ones, as its KV slots) to the drafter that reads them (speculative/)."""
        features = out.features[i] if out.features else None
        if features is not None and self.speculator is not None:
            kept = req.num_computed_tokens - start
            self.speculator.observe(req, start, features[:kept])

    def process_output(self, launched: Launched) -> list[Request]:
        """A launched step's results, once its tokens are on the host (this waits for it).

        Finishing requests go to the cache one by one (a tree insert each), but what the
        cache frees goes to the allocator in one call (`batched_frees`), and they leave the
        running list in one pass at the end: `list.remove` each was O(running), O(n^2) for
        a step finishing most of a batch of 256. Nothing reads the running list in
        between (aborts and sinks' effects run between steps)."""
        launched.out.draw()  # a sampled step's tokens, if the overlap loop has not yet
        with self.cache.batched_frees():
            ended: set[Request] = set()
            finished = self._process_rows(launched, ended)
            if ended:
                self.running[:] = [r for r in self.running if r not in ended]
        return finished

    def _process_rows(self, launched: Launched, ended: set[Request]) -> list[Request]:
        out = launched.out
        tokens = out.tokens.token_ids()
        sampled_at = {i: j for j, i in enumerate(out.tokens.sample_items)}
        now = time.monotonic()
        finished: list[Request] = []
        # Runs per row per step (~10 us a row at batch 256 before): the per-row checks read
        # fields, not properties, and the rare parts (prompt logprobs, pooling) are skipped
        # by one test each.
        prompt_lps, hidden = out.prompt_logprobs, out.hidden
        for i, item in enumerate(launched.batch.items):
            req = item.req
            if req.finish_reason is not None:  # ended (or was aborted) earlier: drop the token
                continue
            plp = prompt_lps[i]
            if plp is None and req.params.return_logprob and req.wants_prompt_logprobs:
                plp = self._first_prompt_logprob(req, item) if item.num_new_tokens else None
            if plp is not None:
                self.output.add_prompt_logprobs(req, plp)
            if hidden and req.hidden_pool is not None:
                pooled = hidden[i]
                if pooled is not None:
                    req.hidden_pool.add(pooled.first, pooled.count, pooled.value)
            j = sampled_at.get(i)
            if item.draft:
                self._take_verified(item, out, i, now)
            elif j is not None:
                if not self._take_token(req, launched.positions[j], j, tokens[j], out, i, now):
                    continue  # its placeholder is gone: aborted since the launch
            elif launched.samples[i] and req.remaining_new_tokens <= 0:
                req.finish(FinishReason.LENGTH)  # max_new_tokens=0: prefill only
            if req.finish_reason is not None:
                self._end(req, ended)
                finished.append(req)
            self.output.emit(req)
        return finished

    @staticmethod
    def _first_prompt_logprob(req: Request, item: ScheduledRequest) -> PromptLogprobs | None:
        """A 1-token prompt's (None, token) entry, which no logits score."""
        start = req.num_computed_tokens - item.num_new_tokens
        return PromptLogprobs(first=1, logprobs=[]) if start == 0 else None

    def _take_token(
        self, req: Request, pos: int, j: int, token: int, out: ForwardOutput, i: int, now: float
    ) -> bool:
        """Put sampled row j's token where its placeholder stands, through the output path
        (stop checks, text, the grammar and its forced tokens). False when it is gone."""
        ids = req.token_ids
        if pos >= len(ids) or ids[pos] != -(out.tokens.base + j):  # its placeholder(j)
            return False
        tail: list[int] | None = None  # None, not a new empty list per row
        if pos == len(ids) - 1:  # the common case: nothing launched since
            ids.pop()
        else:
            tail = ids[pos + 1 :]  # the placeholder of a step launched since (overlap)
            del ids[pos:]
        if req.first_token_time is None:
            req.first_token_time = now
        self._generated_tokens += 1
        if req.grammar is not None and self.grammars is not None:  # `_append`, inlined
            self.grammars.append(req, token, out.logprobs[i], out.top_logprobs[i], self.output)
            if tail and (len(ids) != pos + 1 or ids[pos] != token):
                self._jumped_under_a_step(req, pos, len(ids) > pos and ids[pos] == token)
                return True
        else:
            self.output.append_token(req, token, out.logprobs[i], out.top_logprobs[i])
        if tail and req.finish_reason is None:
            ids.extend(tail)
        return True

    def _jumped_under_a_step(self, req: Request, pos: int, kept: bool) -> None:
        """The grammar did more than append the token at `pos` while a step launched
        since (overlap) computes that token's KV and samples the one after it:
        jump-forward appended forced tokens after it, or replaced it (a retokenization),
        or the grammar refused it (a dead end, which ends the request). That step's
        sample does not follow the sequence any more: its placeholder is not put back,
        so its row is dropped when read (`_take_token` finds it gone), and the next step
        computes the forced tokens. Unless the token at `pos` was `kept`, the KV that
        step computes there is of another token: the request counts it as not computed,
        and its slot goes back."""
        if not kept and req.num_computed_tokens > pos:
            req.num_computed_tokens = pos
            if req.row is not None:
                self.slots.trim(req, pos)

    def _append(
        self, req: Request, token: int, logprob: float | None, top: list[tuple[int, float]] | None
    ) -> None:
        """A sampled token through the output path: the grammar's (which accepts it and
        appends any forced string after it: jump-forward) for a constrained request."""
        if req.grammar is not None and self.grammars is not None:
            self.grammars.append(req, token, logprob, top, self.output)
        else:
            self.output.append_token(req, token, logprob, top)

    def _take_verified(
        self, item: ScheduledRequest, out: ForwardOutput, i: int, now: float
    ) -> None:
        """A drafting row's tokens (its accepted drafts and the one after), one by one
        through the output path (the grammar's, with its jump-forward, for a constrained
        request) until one ends the request or a jump-forward appends forced text. The
        row's KV is kept as far as the sequence still runs through its drafts."""
        req = item.req
        verified = out.verified[i]
        assert verified is not None
        if req.first_token_time is None:
            req.first_token_time = now
        ids = req.token_ids
        start = len(ids) - 1  # the row's first token, the last one before the step
        for token, lp, top in zip(
            verified.tokens, verified.logprobs, verified.top_logprobs, strict=True
        ):
            self._generated_tokens += 1
            before = len(ids)
            self._append(req, token, lp, top)
            if req.finish_reason is not None or len(ids) != before + 1 or ids[-1] != token:
                break  # ended, or forced text (or a retokenized token) took the place
        kept = 1  # the row's first token, then each draft the sequence still holds
        for d in item.draft[: verified.accepted]:
            if start + kept >= len(ids) or ids[start + kept] != d:
                break
            kept += 1
        if start + kept < req.num_computed_tokens:
            req.num_computed_tokens = start + kept
            self.slots.trim(req, req.num_computed_tokens)

    def _end(self, req: Request, ended: set[Request]) -> None:
        """A request that finished: its KV to the cache, into `ended` (the running
        requests to drop at the end of the step's output) or, retracted while its token
        was pending, out of the waiting requests."""
        if req.row is not None:
            self.slots.release(req)
            ended.add(req)
        else:
            self.waiting.remove(req)

    def _finish_abort(self, req: Request, reason: str) -> None:
        _drop_placeholders(req)
        req.error = reason
        req.finish(FinishReason.ABORT)
        self.output.emit(req)
        self._num_aborted += 1

    # ---- stats ----------------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        total = self.allocator.num_usable_slots
        tier = self.cache.tier.stats() if self.cache.tier is not None else None
        spec = self.speculator.stats if self.speculator is not None else None
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_slots_used=total - self.allocator.num_free_slots,
            kv_slots_total=total,
            cache_size=self.cache.total_size(),
            cache_hit_tokens=self._cache_hit_tokens,
            prompt_tokens=self._prompt_tokens,
            generated_tokens=self._generated_tokens,
            num_retractions=self._num_retractions,
            num_steps=self._num_steps,
            constrained_requests=self.grammars.stats.requests if self.grammars else 0,
            jump_forward_tokens=self.grammars.stats.forced_tokens if self.grammars else 0,
            grammar_compiles=self.grammars.compiles if self.grammars else 0,
            num_aborted=self._num_aborted,
            host_cache_hit_tokens=self._host_hit_tokens,
            host_kv_slots_used=tier.slots_used if tier else 0,
            host_kv_slots_total=tier.slots_total if tier else 0,
            host_kv_bytes_loaded=tier.bytes_loaded if tier else 0,
            host_kv_bytes_written=tier.bytes_written if tier else 0,
            host_kv_load_bandwidth=tier.load_bandwidth if tier else 0.0,
            host_kv_write_bandwidth=tier.write_bandwidth if tier else 0.0,
            spec_verify_steps=spec.verify_steps if spec else 0,
            spec_drafted_tokens=spec.drafted_tokens if spec else 0,
            spec_accepted_tokens=spec.accepted_tokens if spec else 0,
            spec_accept_lengths=tuple(spec.accept_lengths) if spec else (),
        )

    def slots_held_by_requests(self) -> int:
        """Slots owned by running requests alone (not shared from the tree), in whole pages."""
        page = self.page_size
        held = 0
        for req in self.running:
            own = req.num_computed_tokens - req.num_shared_tokens
            held += -(-own // page) * page
        return held


def _drop_placeholders(req: Request) -> None:
    """Remove a request's pending tokens (it is being aborted)."""
    ids = req.token_ids
    while len(ids) > req.num_prompt_tokens and ids[-1] < 0:
        ids.pop()

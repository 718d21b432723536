"""Overlap scheduling: build step n+1 while the device runs step n.

Without overlap a step is schedule -> forward -> process_output, and on a GPU the host
parts (allocation, the ForwardBatch, stop checks, detokenizing, streaming) run while the
device waits. With `SchedulerConfig.overlap_schedule` a step is

    schedule(n+1) -> launch(n+1) -> resolve(n)

`launch` runs the forward and samples without waiting: the sampled ids stay on the device
in a "future" buffer, and each sampled request gets a placeholder `-p` (p >= 1) as its
last token id. The next step's inputs resolve `-p` to `future[p]` on the device, so a
request keeps decoding while its last token is unknown to the host. `resolve(n)` then
waits for step n alone (one device-to-host copy), puts the real token in place of the
placeholder and does what process_output does: stop checks, text, streaming, finishing.

A request that ends in step n is noticed one step late: step n+1 already computed its
last token's KV (kept with the rest of its sequence in the radix cache) and sampled one
more token, which is dropped. Its slots are released as usual; nothing leaks.

Counters move at launch (`num_computed_tokens`, the prefix sharing of prefill chunks),
so the scheduler's accounting sees every launched token. A placeholder sits at or past
`num_computed_tokens`, so no placeholder ever reaches the radix cache; a request retracted
while its token is pending is not readmitted until its token is resolved.

Requests whose next step needs their tokens on the host make the engine step
synchronously while they are present: grammars (the mask and jump-forward read the
accepted text), logprobs, penalties and min_new_tokens (they read the output ids), and
max_new_tokens 0. The step first resolves the pending one, then runs the plain
schedule -> forward -> process_output. So outputs are those of the synchronous scheduler.

Under tensor parallelism the followers get the resolved input ids in rank 0's per-step
broadcast (tp/step.py), as they get the KV slots.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixmesh.worker.batch import Batch
from radixmesh.worker.forward_batch import to_device
from radixmesh.worker.model_runner import ModelRunner, _sampling_row
from radixmesh.worker.request import FinishReason, Request
from radixmesh.worker.sampler import reads_output_ids

if TYPE_CHECKING:
    from radixmesh.worker.scheduler import Scheduler


def needs_host_tokens(req: Request) -> bool:
    """Whether `req`'s steps must see its previous token on the host (see the module)."""
    p = req.params
    return (
        req.grammar is not None or p.return_logprob or reads_output_ids(p) or p.max_new_tokens == 0
    )


@dataclass
class PendingTokens:
    """The next-token ids of a launched step, one per sampled item (`sample_items`,
    ascending item indices), possibly still being computed."""

    sample_items: list[int]
    ids: torch.Tensor  # [N] on the host: pinned and filled asynchronously on CUDA
    event: torch.cuda.Event | None = None  # recorded after the copy; None on CPU

    def token_ids(self) -> list[int]:
        """Waits for this step only, not for the steps launched after it."""
        if self.event is not None:
            self.event.synchronize()
        return [int(t) for t in self.ids.tolist()]


class FutureLauncher:
    """Launches steps on a ModelRunner without reading their tokens back.

    `future` holds two steps' sampled ids (parity 0 and 1: one is being resolved while
    the next runs), each at most `max_rows` (max_running_requests) long; index 0 is
    unused so that every placeholder is negative.
    """

    def __init__(self, runner: object, max_rows: int) -> None:
        if not isinstance(runner, ModelRunner):
            raise ValueError("overlap_schedule: needs the engine's ModelRunner")
        self.runner = runner
        self.max_rows = max_rows
        device = runner.req_table.table.device
        self.future = torch.zeros(1 + 2 * max_rows, dtype=torch.int64, device=device)
        self._host: list[torch.Tensor] = []
        if device.type == "cuda":
            self._host = [torch.empty(max_rows, dtype=torch.int64, pin_memory=True) for _ in "01"]

    def placeholder(self, parity: int, j: int) -> int:
        """The token id standing for sampled row j of a step launched with `parity`."""
        return -(1 + parity * self.max_rows + j)

    @torch.inference_mode()
    def launch(self, batch: Batch, parity: int) -> PendingTokens:
        """Forward and sample `batch`; row j's id goes to the device's future buffer (where
        the next step's inputs read it) and, behind the forward, to the host."""
        runner = self.runner
        fb = runner._forward_batch(batch)
        ids_in = fb.input_ids
        fb.input_ids = torch.where(ids_in < 0, self.future[ids_in.neg().clamp_(min=0)], ids_in)
        rows = runner._rows(batch)
        assert not rows.prompt_rows, "prompt logprobs need a synchronous step"
        n = len(rows.sample_rows)
        assert n <= self.max_rows
        # Before the forward is launched: on CUDA a blocking copy would wait for it.
        index = to_device(torch.tensor(rows.sample_rows, dtype=torch.int64), self.future.device)
        if runner.followers is not None:  # they get the resolved ids in the broadcast
            runner.followers.send_step(batch, fb, rows.sample_rows, ids_on_device=True)
        graphs = runner.decode_graphs
        if graphs is not None and graphs.can_run(fb):
            hidden = graphs.run(fb)  # [B, hidden]
        else:
            runner.attn.prepare(fb)
            hidden = runner.model(fb, runner.attn)  # [T, hidden]
        if n == 0:
            return PendingTokens([], torch.empty(0, dtype=torch.int64))
        logits = runner.model.compute_logits(hidden.index_select(0, index))  # [N, V] fp32
        sampling = [_sampling_row(batch.items[i].req) for i in rows.sample_items]
        ids = runner.sampler.sample_ids(logits, sampling)  # [N] on the device
        base = 1 + parity * self.max_rows
        self.future[base : base + n] = ids
        if not self._host:
            return PendingTokens(rows.sample_items, ids)
        host = self._host[parity][:n]
        host.copy_(ids, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return PendingTokens(rows.sample_items, host, event)


@dataclass
class _Launched:
    batch: Batch
    pending: PendingTokens
    samples: list[bool]  # per item: the step reached the end of the sequence
    positions: list[int]  # per sampled row: index of its placeholder in req.token_ids
    placeholders: list[int]  # per sampled row


class OverlapLoop:
    """`Scheduler.step` with overlap_schedule on (see the module docstring)."""

    def __init__(self, sched: Scheduler, launcher: FutureLauncher) -> None:
        self.sched = sched
        self.launcher = launcher
        self.inflight: _Launched | None = None
        self._parity = 0
        self._host_bound: list[Request] = []  # unfinished requests that force sync steps

    def add(self, req: Request) -> None:
        if needs_host_tokens(req):
            self._host_bound.append(req)

    def step(self) -> list[Request]:
        sched = self.sched
        finished: list[Request] = []
        if self._host_bound:
            self._host_bound = [r for r in self._host_bound if not r.finished]
        if self._host_bound:  # a synchronous step, after the pending one
            if self.inflight is not None:
                finished += self.resolve_inflight()
            return finished + sched.step_sync()
        batch = sched.schedule()
        launched = self._launch(batch) if batch is not None else None
        if self.inflight is not None:
            finished += self.resolve_inflight()
        if (
            finished
            and launched is not None
            and all(it.req.finished for it in launched.batch.items)
        ):
            launched = None  # only tokens to drop: the engine is idle now
        self.inflight = launched
        return finished

    def resolve_inflight(self) -> list[Request]:
        launched, self.inflight = self.inflight, None
        return self._resolve(launched) if launched is not None else []

    def _launch(self, batch: Batch) -> _Launched:
        sched = self.sched
        parity, self._parity = self._parity, self._parity ^ 1
        items = batch.items
        samples = [
            it.req.num_computed_tokens + it.num_new_tokens == len(it.req.token_ids) for it in items
        ]
        pending = self.launcher.launch(batch, parity)
        sched._num_steps += 1
        for item in items:  # process_output's counters, moved to launch
            req = item.req
            start = req.num_computed_tokens
            req.num_computed_tokens = start + item.num_new_tokens
            if item.num_new_tokens > 1 and start < req.num_prompt_tokens:
                sched._share_prefix(req)  # a prompt chunk, for others to reuse
        positions: list[int] = []
        placeholders: list[int] = []
        for j, i in enumerate(pending.sample_items):
            ids = items[i].req.token_ids
            positions.append(len(ids))
            placeholders.append(self.launcher.placeholder(parity, j))
            ids.append(placeholders[-1])
        return _Launched(batch, pending, samples, positions, placeholders)

    def _resolve(self, launched: _Launched) -> list[Request]:
        """process_output for a launched step, once its tokens are on the host."""
        sched = self.sched
        tokens = launched.pending.token_ids()
        sample_items = launched.pending.sample_items
        now = time.monotonic()
        finished: list[Request] = []
        j = 0
        for i, item in enumerate(launched.batch.items):
            req = item.req
            sampled = j < len(sample_items) and sample_items[j] == i
            jj, j = j, j + sampled
            if req.finished:  # ended (or was aborted) in an earlier step: drop the token
                continue
            tail: list[int] = []
            if sampled:
                pos = launched.positions[jj]
                if pos >= len(req.token_ids) or req.token_ids[pos] != launched.placeholders[jj]:
                    continue
                tail = req.token_ids[pos + 1 :]  # the placeholder of a step launched since
                del req.token_ids[pos:]
                if req.first_token_time is None:
                    req.first_token_time = now
                sched._generated_tokens += 1
                sched.output.append_token(req, tokens[jj], None, None)
            elif launched.samples[i] and req.remaining_new_tokens <= 0:
                req.finish(FinishReason.LENGTH)
            if req.finished:
                if req.row is not None:  # running
                    sched.running.remove(req)
                    sched._release(req)
                else:  # retracted while its token was pending
                    sched.waiting.remove(req)
                finished.append(req)
            sched.output.emit(req)
            if tail and not req.finished:
                req.token_ids.extend(tail)
        return finished


def drop_placeholders(req: Request) -> None:
    """Remove a request's pending tokens (it is being aborted)."""
    ids = req.token_ids
    while len(ids) > req.num_prompt_tokens and ids[-1] < 0:
        ids.pop()

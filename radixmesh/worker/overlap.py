"""Overlap scheduling: the scheduler's one step, ordered so the host builds step n+1 while
the device runs step n.

A step is schedule -> launch -> process_output (scheduler.py). `launch` runs the forward
without waiting for the device: the sampled ids stay there, each sampled request gets a
placeholder (< 0) as its last token, and the next step's inputs read the real ids on the
device (model_runner.py). So with `SchedulerConfig.overlap_schedule` a step is

    schedule(n+1) -> launch(n+1) -> process_output(n)

and process_output(n) (stop checks, detokenizing, streaming, finishing) runs while the
device computes step n+1. The radix cache's bookkeeping reads the requests' slots on the
host (the req->token table's mirror), so admission and finishing never wait for the step
in flight either.

A request that ends in step n on a token (EOS, a stop id or string) is noticed one step
late: step n+1 already computed its last token's KV (kept with the rest of its sequence in
the radix cache) and sampled one more token, which is dropped. Its slots are released as
usual; nothing leaks. One that ends by its length (max_new_tokens, the context) is known to
end on the host when step n is scheduled, so step n+1 leaves it out
(`Scheduler._to_run`), as a synchronous step would. A request
retracted while its token is pending is not readmitted until that token is read.

Greedy rows take one argmax, queued behind the forward. A top-p row without top-k, in a
step with more than a few, waits for the forward on CUDA: the sampler reads back whether
its top-W window decided it (sampler.py; every other draw is queued without a wait).
Run at the launch, that wait made process_output(n) and the building of step n+2 run
with the GPU idle. So the runner defers every draw that is not one argmax
(`ForwardOutput.draw`) and the loop runs it after building the next step, just before
launching it:

    schedule(n+1) -> draw(n) -> launch(n+1) -> process_output(n)

The device still computes draw(n) before step n+1 (one stream), so the placeholders read
the same tokens, and the draws run in the same order as before, from the same generator
states: sampled output is unchanged. What the GPU still waits for, where a top-p row
made the draw wait, is the draw's host work after that read and step n+1's inputs.

Penalties and min_new_tokens read a row's output ids when it draws. At the launch of step
n+1 the last of them (step n's) is still a placeholder; the deferred draw of step n+1 runs
after process_output(n) has put it on the host, so it reads the real ids, counted as at
the launch (model_runner.py). Logprobs are read back by the draw. None of them makes
steps synchronous.

A constrained row's grammar mask is filled by its draw too, after the grammar accepted
the previous token. Jump-forward then appends forced text in process_output(n), under
step n+1: that step's row for the request is dropped (its placeholder is not put back)
and, where the jump retokenized token n itself, the KV step n+1 computes for it is taken
back (`Scheduler._jumped_under_a_step`).

Steps that need the last tokens on the host (`Scheduler.needs_host_tokens`: a request
that may draft; a constrained one with page_size > 1) are synchronous while present:
the pending step is processed first, then the plain schedule -> launch -> process_output.
So outputs are those of the synchronous scheduler. Under tensor parallelism the followers
get the resolved input ids in rank 0's per-step broadcast (tp/step.py), as they get the KV
slots.
"""

from __future__ import annotations

from typing import Protocol

from radixmesh.worker.batch import Batch, Launched
from radixmesh.worker.request import Request


class OneStep(Protocol):
    """The scheduler's step, in its parts (`Scheduler`)."""

    def schedule(self) -> Batch | None: ...
    def launch(self, batch: Batch) -> Launched: ...
    def process_output(self, launched: Launched) -> list[Request]: ...
    def step_sync(self) -> list[Request]: ...
    def needs_host_tokens(self) -> bool: ...


class OverlapLoop:
    """`Scheduler.step` with overlap_schedule on: when a launched step is processed."""

    def __init__(self, steps: OneStep) -> None:
        self.steps = steps
        self.inflight: Launched | None = None

    def step(self) -> list[Request]:
        steps = self.steps
        if steps.needs_host_tokens():  # a synchronous step, after the pending one
            return self.process_inflight() + steps.step_sync()
        batch = steps.schedule()
        if self.inflight is not None:
            self.inflight.out.draw()  # step n's sampled tokens, before step n+1 reads them
        launched = steps.launch(batch) if batch is not None else None
        finished = self.process_inflight()
        if (
            finished
            and launched is not None
            and all(it.req.finished for it in launched.batch.items)
        ):
            launched = None  # only tokens to drop: the engine is idle now
        self.inflight = launched
        return finished

    def process_inflight(self) -> list[Request]:
        launched, self.inflight = self.inflight, None
        return self.steps.process_output(launched) if launched is not None else []

"""Resumable requests: a request's outputs kept on the worker, so that a caller whose
connection dropped (its router was killed) can continue it from any router.

A resumable Generate (GenerateRequest.resumable) does not read the engine's stream on its
own call: a task of the request's `OutputLog` reads it into the log, and each call that
follows the request (the first one, then any resume) reads the log from an offset. A call
that ends without an Abort so leaves the request running; once no call follows it, it is
held for `grace` seconds, then aborted (its KV slots freed by the next scheduler step) and
its log dropped. A finished request's log stays as long, for a caller whose router died
after the worker sent the last chunk but before the caller got it. An Abort ends the
request at once.

Bounds: time (`grace`) and bytes (`max_bytes` over the logs of requests no call follows;
past it the oldest are dropped, the unfinished ones aborted). Offsets are completion
tokens: a caller that has the outputs up to N tokens resumes at N, which is always the
end of one of the log's outputs (routers join outputs, never split them).

Owned by the worker's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from radixmesh.errors import InvalidArgument, NotFound

if TYPE_CHECKING:
    from radixmesh.worker.request_output import RequestOutput


@dataclass(frozen=True)
class ResumeConfig:
    # Seconds a request no call follows is held for a resume before it is aborted.
    grace: float = 30.0
    # Bytes of output (text, token ids, logprobs) held for requests no call follows.
    max_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.grace < 0:
            raise InvalidArgument("resume_grace", f"must be >= 0, got {self.grace}")
        if self.max_bytes < 0:
            raise InvalidArgument("resume_max_bytes", f"must be >= 0, got {self.max_bytes}")


def _size(out: RequestOutput) -> int:
    """Roughly what an output holds: its text, ids and logprob entries."""
    top = sum(len(t) for t in out.new_top_logprobs)
    return 64 + len(out.text_delta.encode()) + 8 * len(out.new_token_ids) + 24 * top


class OutputLog:
    """One resumable request's outputs, read from the engine by a task of its own."""

    def __init__(
        self,
        rid: str,
        owner: str,
        outputs: AsyncIterator[RequestOutput],
        on_finish: Callable[[OutputLog], None] = lambda log: None,
    ) -> None:
        self.rid = rid
        self.owner = owner
        self.outputs: list[RequestOutput] = []
        self.ends: list[int] = []  # completion tokens after each output
        self.nbytes = 0
        self.finished = False  # the engine sent the last output (or failed)
        self.error: BaseException | None = None
        self.followers = 0
        self.idle_since = time.monotonic()  # when the last follower left
        self._on_finish = on_finish
        self._changed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read(outputs))

    async def _read(self, outputs: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in outputs:
                self.outputs.append(out)
                self.ends.append(out.meta_info.completion_tokens)
                self.nbytes += _size(out)
                if out.finished:
                    self._finish()
                self._wake()
        except Exception as e:  # the request failed: its followers raise it
            self.error = e
        finally:
            self._finish()
            self._wake()

    def _finish(self) -> None:
        if not self.finished:
            self.finished = True
            self._on_finish(self)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def start_of(self, offset: int) -> int:
        """The index of the output that follows the first `offset` completion tokens."""
        if offset == 0:
            return 0
        for i, end in enumerate(self.ends):
            if end == offset:
                return i + 1
            if end > offset:
                break
        produced = self.ends[-1] if self.ends else 0
        raise InvalidArgument(
            "resume_from.offset",
            f"{offset} is not where one of the stream's messages ended "
            f"({produced} tokens produced so far)",
        )

    async def follow(self, offset: int) -> AsyncIterator[RequestOutput]:
        """The outputs after `offset` tokens, those already here joined into one, then
        each as it comes; ends after the finished one. A resume at the end of a finished
        request gets its last output again with no tokens (its finish): a caller whose
        router died after sending the last chunk but before ending the call resumes there,
        and a stream that ended with no finish would leave its router waiting for one."""
        i = self.start_of(offset)
        if self.outputs and i == len(self.outputs) and self.outputs[-1].finished:
            yield replace(
                self.outputs[-1],
                new_token_ids=[],
                text_delta="",
                new_token_logprobs=[],
                new_top_logprobs=[],
            )
            return
        while True:
            if i < len(self.outputs):
                joined = self.outputs[i]
                for out in self.outputs[i + 1 :]:
                    joined = joined.then(out)
                i = len(self.outputs)
                yield joined
                if joined.finished:
                    return
            elif self.finished:
                if self.error is not None:
                    raise self.error
                return
            else:
                await self._changed.wait()

    def cancel(self) -> None:
        self._task.cancel()


class HeldRequests:
    """The worker's resumable requests by id: started, followed, held, expired.

    Each call is O(1) but a sweep, once every quarter of the grace (at most 1 s): the
    requests no call follows are kept in the order they became so."""

    def __init__(self, config: ResumeConfig, abort: Callable[[str], None]) -> None:
        self.config = config
        self._abort = abort  # the engine's abort(rid)
        self.logs: dict[str, OutputLog] = {}
        self.generating = 0  # requests of these logs the engine still runs
        self._counted: set[str] = set()  # their ids
        self.expired = 0  # requests aborted because no caller came back in time
        self.resumes = 0  # calls that followed a held request again (`attach`)
        self._idle: OrderedDict[str, OutputLog] = OrderedDict()  # no follower, oldest first
        self._idle_bytes = 0  # their bytes (as of when each became idle; resynced by sweeps)
        self._sweeper: asyncio.Task[None] | None = None

    def start(self, rid: str, owner: str, outputs: AsyncIterator[RequestOutput]) -> OutputLog:
        log = self.logs[rid] = OutputLog(rid, owner, outputs, self._release)
        log.followers = 1
        self.generating += 1
        self._counted.add(rid)
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        return log

    def _release(self, log: OutputLog) -> None:
        """The request stops counting as generating: when its last output is read, or at
        once when it is aborted (the engine is told then; its final output may come a
        step later, and a new request must not be refused meanwhile, as a plain call's
        request stops counting when the call is cancelled)."""
        if log.rid in self._counted:
            self._counted.discard(log.rid)
            self.generating -= 1

    def attach(self, rid: str, owner: str) -> OutputLog:
        """A held request to follow; NotFound when none has that id and owner (a
        different key learns nothing of another's streams)."""
        log = self.logs.get(rid)
        if log is None or log.owner != owner:
            raise NotFound(
                f"no stream {rid[:64]!r} is held here: it finished or was not resumed within "
                f"the {self.config.grace:g} s grace period"
            )
        if self._idle.pop(rid, None) is not None:
            self._idle_bytes -= log.nbytes
        log.followers += 1
        self.resumes += 1
        return log

    def detach(self, log: OutputLog) -> None:
        """A call stopped following `log` (done, failed or dropped): with no other
        follower, the grace period starts."""
        log.followers -= 1
        if log.followers == 0 and log.rid in self.logs:
            log.idle_since = time.monotonic()
            self._idle[log.rid] = log
            self._idle_bytes += log.nbytes
            while self._idle_bytes > self.config.max_bytes and self._idle:
                self._drop(self._idle.popitem(last=False)[1])

    def abort(self, rid: str) -> bool:
        """End a held request now (an Abort): whether one was still generating."""
        log = self.logs.get(rid)
        if log is None or log.finished:
            return False
        self._abort(rid)
        self._release(log)
        return True

    @property
    def delivering(self) -> int:
        """Finished requests a call still follows. `generating` stops counting a request
        when its log reads the last output, before the following call has passed it on:
        a drain that waited only for `generating` closed the output streams under such a
        call, whose last output then never went out. O(logs): for the drain, not per
        request."""
        return sum(1 for log in self.logs.values() if log.followers > 0 and log.finished)

    @property
    def waiting(self) -> int:
        """Held requests no call follows (generating or finished): those a resume may
        still take, until the grace passes."""
        return len(self._idle)

    @property
    def unfinished(self) -> int:
        """Held requests still generating that no call follows."""
        return sum(1 for log in self._idle.values() if not log.finished)

    def sweep(self, now: float) -> None:
        """Drop the logs no call followed for `grace` seconds; abort those unfinished (the
        engine frees their slots by its next step; their readers end with the abort)."""
        while self._idle:
            log = next(iter(self._idle.values()))
            if now - log.idle_since < self.config.grace:
                break
            del self._idle[log.rid]
            self._drop(log)
        self._idle_bytes = sum(log.nbytes for log in self._idle.values())

    def _drop(self, log: OutputLog) -> None:
        self._idle_bytes -= log.nbytes
        del self.logs[log.rid]
        if not log.finished:
            self.expired += 1
            self._abort(log.rid)
            self._release(log)

    async def _sweep(self) -> None:
        interval = min(max(self.config.grace / 4, 0.05), 1.0)
        while self.logs:
            await asyncio.sleep(interval)
            self.sweep(time.monotonic())

    def close(self) -> None:
        """Stop reading every log (the server stops; the engine aborts what runs)."""
        for log in self.logs.values():
            log.cancel()
        self.logs.clear()
        self._idle.clear()
        if self._sweeper is not None:
            self._sweeper.cancel()

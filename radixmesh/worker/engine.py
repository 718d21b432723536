"""Engine: the in-process API over one worker (SGLang's `Engine` shape).

The scheduler runs in a background thread that owns all worker state; callers talk to
it through an inbox of typed commands (commands.py: requests, aborts, queries) and get
results through per-request sinks. So `generate` may be called from any thread or event
loop, and an abort or a disconnect reaches the scheduler between two steps.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import queue
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.admission import Admission
from radixmesh.worker.commands import (
    Abort,
    AbortAll,
    AddCacheListener,
    AddRequest,
    AddRequests,
    CacheSnapshot,
    Command,
    FlushCache,
    GetStats,
    GrammarChanged,
    Inspect,
    Query,
    RankFailed,
    Stop,
    handle,
)
from radixmesh.worker.config import EngineConfig
from radixmesh.worker.detokenizer import IncrementalDetokenizer
from radixmesh.worker.engine_info import EngineInfo
from radixmesh.worker.engine_inputs import (
    InputIds,
    Params,
    Prompt,
    normalize_inputs,
    normalize_params,
)
from radixmesh.worker.kvcache.events import CacheEvent, CacheListener
from radixmesh.worker.mailbox import Mailbox, next_item
from radixmesh.worker.request import HiddenPool, Pooling, Request
from radixmesh.worker.request_output import Accumulator, Delivery, RequestOutput, embedding_of
from radixmesh.worker.score import score_of, score_requests
from radixmesh.worker.tp.leader import RankFailure
from radixmesh.worker.worker import Worker

logger = logging.getLogger(__name__)

__all__ = ["Engine", "InputIds", "Params", "Prompt"]


class Engine:
    """`Engine(model="smollm2", **options)`; options are `EngineConfig` fields, flat."""

    def __init__(self, model: str = "smollm2", **options: Any) -> None:
        self.worker = Worker(EngineConfig.from_options(model=model, **options))
        # The worker's: batch sizes left unset are filled in for its device.
        self.config = self.worker.config
        self.tokenizer = self.worker.tokenizer
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()  # commands.py
        self._closed = False
        self._fatal: str | None = None  # why the scheduler thread died, if it did
        self._draining = False  # drain(): new requests get Unavailable
        sc = self.config.scheduler
        self.admission = Admission(sc.running_cap + sc.max_queued_requests)
        # Per event loop: hands that loop's requests their outputs (see Mailbox).
        self._mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox] = (
            weakref.WeakKeyDictionary()
        )
        # The compile cache's announcements reach the scheduler thread in order (a queue),
        # where the cache-event listeners hear them (constrained/announced.py). The hook
        # holds the queue, not the engine: the compile pool outlives a shut-down engine,
        # and must not keep its weights and KV pool alive.
        inbox = self._inbox
        self.worker.grammars.on_change = lambda kind, key: inbox.put(GrammarChanged(kind, key))
        self._frozen = self.config.scheduler.gc_freeze
        if self._frozen:  # what start-up built: out of the collector's full walks
            gc.collect()
            gc.freeze()
        self._thread = threading.Thread(target=self._loop, name="radixmesh-scheduler", daemon=True)
        self._thread.start()
        if self.worker.followers is not None:  # a TP rank dying ends the engine
            self.worker.followers.watch(self._on_rank_failure)

    # ---- public API -----------------------------------------------------------------

    def generate(
        self,
        prompt: Prompt = None,
        sampling_params: Params = None,
        input_ids: InputIds = None,
        stream: bool = False,
    ) -> dict[str, Any] | list[dict[str, Any]] | Generator[dict[str, Any], None, None]:
        """Generate for one prompt (-> a dict) or a list (-> a list of dicts).

        SGLang's argument order (prompt, sampling_params, input_ids), so positional calls
        written for SGLang work. stream=True -> an iterator of chunks whose "text" and
        "output_ids" are deltas (the last one carries the final meta_info); a generator,
        so closing it early (`.close()`) aborts the request and frees its KV."""
        reqs, single, compiles = self._make_requests(prompt, input_ids, sampling_params)
        for done in compiles:  # the caller's thread waits; the scheduler never does
            done.result()
        if stream:
            if not single or len(reqs) != 1:
                raise InvalidArgument("stream", "streaming takes one prompt with n=1")
            return self._stream(reqs[0])
        queues = self._submit_all(reqs)
        try:
            results = [self._collect(q).result() for q in queues]
        except BaseException:  # Ctrl-C in the caller: don't leave its requests running
            for r in reqs:
                self.abort(r.rid)
            raise
        return results[0] if single and len(results) == 1 else results

    async def async_generate(
        self,
        prompt: Prompt = None,
        sampling_params: Params = None,
        input_ids: InputIds = None,
        stream: bool = False,
    ) -> dict[str, Any] | list[dict[str, Any]] | AsyncIterator[dict[str, Any]]:
        reqs, single, compiles = self._make_requests(prompt, input_ids, sampling_params)
        if stream:
            if not single or len(reqs) != 1:
                raise InvalidArgument("stream", "streaming takes one prompt with n=1")
            return self._astream(reqs[0], compiles)
        for done in compiles:
            await asyncio.wrap_future(done)
        results = [acc.result() for acc in await self._arun(reqs)]
        return results[0] if single and len(results) == 1 else results

    def encode(
        self, prompt: Prompt = None, input_ids: InputIds = None, pooling: str = "mean"
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """Embeddings: each prompt's final hidden states (after the model's last norm),
        pooled: "mean" over every position or the "last" position's. No token is
        sampled. One prompt -> a dict {"embedding", "meta_info"}; a list -> a list."""
        reqs, single = self._make_embed_requests(prompt, input_ids, pooling)
        queues = self._submit_all(reqs)
        try:
            results = [_embedding_dict(self._collect(q).output()) for q in queues]
        except BaseException:
            for r in reqs:
                self.abort(r.rid)
            raise
        return results[0] if single else results

    async def async_encode(
        self, input_ids: list[int], pooling: str = "mean", rid: str | None = None
    ) -> RequestOutput:
        """`encode` for one tokenized prompt under a caller-chosen id (so `abort(rid)`
        reaches it): its final output, whose `embedding` is set (else RequestAborted);
        cancelling the caller aborts the request."""
        (req,), _ = self._make_embed_requests(None, input_ids, pooling)
        if rid is not None:
            req.rid = rid
        (acc,) = await self._arun([req])
        out = acc.output()
        embedding_of(out)
        return out

    def abort(self, rid: str) -> None:
        if self.admission.take(rid) is not None:
            return  # it ends as aborted when its compile settles (see `submit`)
        self.admission.leave(rid)  # gone by the next step: its place is free now
        self._post(Abort(rid))

    def flush_cache(self) -> bool:
        """Empty the radix cache. False (nothing done) while requests are in flight."""
        return bool(self._ask(FlushCache()))

    def get_stats(self) -> Any:
        return self._ask(GetStats())

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the scheduler thread between steps (tests use it to inspect state)."""
        return self._ask(Inspect(fn))

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive() and self._fatal is None:
            self._post(AbortAll("engine shut down"))
            self._inbox.put(Stop())
            self._thread.join(timeout=30)
        if self._frozen:  # (process-wide: another engine's objects too, which costs it
            gc.unfreeze()  # only time) so that the worker's objects can be collected
        self.worker.close()

    @property
    def fatal(self) -> str | None:
        """Why the engine stopped serving (a dead scheduler or TP rank); None while fine."""
        return self._fatal

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- serving: what the gRPC worker server needs ---------------------------------

    def async_stream(
        self,
        input_ids: list[int],
        sampling_params: Params = None,
        rid: str | None = None,
        delivery: Delivery = Delivery.STEPS,
    ) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs under a caller-chosen id (so `abort(rid)` reaches it):
        each step's (`delivery` steps), or only the first and the last, or the last.

        Validates now (raises InvalidArgument / Unavailable before anything runs); the
        request is submitted on the first iteration. Closing the iterator early aborts it."""
        reqs, _, compiles = self._make_requests(None, input_ids, sampling_params)
        if len(reqs) != 1:
            raise InvalidArgument("sampling_params.n", "a stream takes n=1")
        if rid is not None:
            reqs[0].rid = rid
        reqs[0].delivery = delivery
        return self._aoutputs(reqs[0], compiles)

    def submit(
        self,
        input_ids: list[int],
        sampling_params: Params,
        rid: str,
        sink: Callable[[RequestOutput], None],
        pooling: str | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        delivery: Delivery = Delivery.STEPS,
    ) -> None:
        """Validate one request (raises InvalidArgument / Overloaded / Unavailable) and
        start it under `rid`, handing each step's output (or those `delivery` names) to
        `sink` on the scheduler thread (which must only hand it on). The engine process's
        child serves its server through this. With `pooling`, an embedding request (see
        `encode`; `sampling_params` unused).

        A constraint compiles first, with no thread waiting for it: the request starts
        when it compiled, or `on_error` gets its InvalidArgument (without `on_error`,
        this call waits for the compile and raises)."""
        if pooling is not None:
            reqs, _ = self._make_embed_requests(None, input_ids, pooling)
            compiles: list[Future[None]] = []
        else:
            reqs, _, compiles = self._make_requests(None, input_ids, sampling_params)
        if len(reqs) != 1:
            raise InvalidArgument("sampling_params.n", "a stream takes n=1")
        req = reqs[0]
        req.rid = rid
        req.sink = sink
        req.delivery = delivery
        if not compiles or on_error is None:
            for done in compiles:
                done.result()
            self.admission.reserve(1)
            self._enqueue(req)
            return
        self.admission.reserve(1)
        self.admission.hold(req)
        compiles[0].add_done_callback(lambda f: self._compiled(req, f, on_error))

    def _compiled(
        self, req: Request, done: Future[None], on_error: Callable[[BaseException], None]
    ) -> None:
        """`submit`'s request once its constraint compiled (on the compile pool's thread)."""
        aborted = self.admission.take(req.rid) is None
        error = done.exception()
        if error is not None:
            self.admission.release(1)
            on_error(error)
            return
        try:
            self._enqueue(req, abort=aborted)
        except Unavailable as e:
            on_error(e)

    @property
    def info(self) -> EngineInfo:
        """What the worker server tells clients about the model."""
        w, mc = self.worker, self.config.model
        template = getattr(getattr(self.tokenizer, "hf_tokenizer", None), "chat_template", None)
        return EngineInfo(
            model=mc.model,
            served_model=mc.served_model_name or mc.model,
            tokenizer_spec=w.tokenizer_spec,
            chat_template=template if isinstance(template, str) else "",
            context_len=w.context_len,
            vocab_size=w.arch.vocab_size,
            eos_ids=frozenset(w.eos_ids),
            bos_token_id=self.tokenizer.bos_token_id,
            hidden_size=w.arch.hidden_size,
            deterministic=mc.deterministic,
        )

    def cache_snapshot(self, stamp: Callable[[], int]) -> tuple[int, list[CacheEvent]]:
        """The radix cache's contents with `stamp()`, both read on the scheduler thread,
        where cache events fire: a listener's event count stamps exactly this snapshot."""
        return self._ask(CacheSnapshot(stamp))

    async def async_score(
        self, input_ids: list[int], continuations: list[list[int]]
    ) -> list[list[float]]:
        """Logprob of each continuation token given the prompt (and the tokens before it):
        one request per continuation (worker/score.py). Cancelling it aborts them all."""
        prompts, params = score_requests(input_ids, continuations)
        reqs, _, _ = self._make_requests(None, prompts, [params] * len(prompts))
        return [score_of(acc.output().meta_info) for acc in await self._arun(reqs)]

    def add_cache_listener(self, fn: CacheListener, snapshot: bool = False) -> list[CacheEvent]:
        """Attach a cache-event listener on the scheduler thread (where events fire).

        fn runs on the scheduler thread: it must only hand the event on (e.g. to a queue).
        With snapshot=True, returns the cache's contents taken atomically with attaching."""
        return list(self._ask(AddCacheListener(fn, snapshot)))

    def drain(self) -> None:
        """Stop admitting: new requests get Unavailable; requests in flight continue."""
        self._draining = True

    @property
    def draining(self) -> bool:
        return self._draining

    def abort_all(self, reason: str = "aborted") -> None:
        self._post(AbortAll(reason))

    # ---- requests -------------------------------------------------------------------

    def _make_requests(
        self, prompt: Prompt, input_ids: InputIds, sampling_params: Params
    ) -> tuple[list[Request], bool, list[Future[None]]]:
        """Validate everything first: a bad item rejects the call before anything runs.
        Returns the requests, whether the call was for one, and the futures of their
        constraints' compiles (started here; each settles with None or an InvalidArgument)."""
        if self._closed:
            raise Unavailable("the engine is shut down")
        if self._draining:
            raise Unavailable("the worker is draining: it takes no new requests")
        ids_list, single = normalize_inputs(self.tokenizer, prompt, input_ids)
        params_list = normalize_params(sampling_params, len(ids_list))
        reqs: list[Request] = []
        for ids, params in zip(ids_list, params_list, strict=True):
            self.worker.validate(ids, params)
            self.worker.grammars.check(params)
            for _ in range(params.n):
                reqs.append(self._request(ids, params.replace(n=1) if params.n > 1 else params))
        self.admission.check(len(reqs))
        compiles = []
        for params in {id(p): p for p in params_list}.values():
            if (done := self.worker.grammars.prepare(params)) is not None:
                compiles.append(done)
        return reqs, single and params_list[0].n == 1, compiles

    def _enqueue(self, req: Request, *, abort: bool = False) -> None:
        """Hand a reserved request to the scheduler; its finish releases its place.
        `abort`: it was aborted before it got here (it ends at once, with its output)."""
        assert req.sink is not None
        req.sink = self.admission.counted(req.rid, req.sink)
        try:
            self._post(AddRequest(req, aborted=abort))
        except Unavailable:
            self.admission.leave(req.rid)
            raise

    def _enqueue_all(self, reqs: list[Request]) -> None:
        """`_enqueue` for the reserved requests of one call, in one message: the scheduler
        adds them all between two steps."""
        for req in reqs:
            assert req.sink is not None
            req.sink = self.admission.counted(req.rid, req.sink)
        try:
            self._post(AddRequests(tuple(reqs)))
        except Unavailable:
            for req in reqs:
                self.admission.leave(req.rid)
            raise

    def _make_embed_requests(
        self, prompt: Prompt, input_ids: InputIds, pooling: str
    ) -> tuple[list[Request], bool]:
        try:
            kind = Pooling(pooling)
        except ValueError:
            raise InvalidArgument("pooling", f"must be mean or last, got {pooling!r}") from None
        reqs, single, _ = self._make_requests(prompt, input_ids, _PREFILL_ONLY)
        for r in reqs:
            r.hidden_pool = HiddenPool(kind)
        return reqs, single

    def _request(self, ids: Sequence[int], params: SamplingParams) -> Request:
        req = Request(
            rid=uuid.uuid4().hex,
            prompt_ids=ids,
            params=params,
            stop_ids=self.worker.stop_ids(params),
        )
        req.detokenizer = IncrementalDetokenizer(
            self.tokenizer,
            ids,
            skip_special_tokens=params.skip_special_tokens,
            stop=params.stop,
            no_stop_trim=params.no_stop_trim,
            stop_regex=params.stop_regex,
        )
        return req

    def _submit_all(self, reqs: list[Request]) -> list[queue.SimpleQueue[RequestOutput]]:
        # n > 1 and repeated prompts need nothing special here: the scheduler defers a
        # request whose prompt starts like one it admitted in the same step, so copies
        # after the first hit the cache (see step_prefixes.py).
        self.admission.reserve(len(reqs))
        queues: list[queue.SimpleQueue[RequestOutput]] = []
        for r in reqs:
            r.delivery = Delivery.LAST  # collected whole: one output when it ends
            q: queue.SimpleQueue[RequestOutput] = queue.SimpleQueue()
            r.sink = q.put
            queues.append(q)
        self._enqueue_all(reqs)
        return queues

    def _submit(self, req: Request) -> queue.SimpleQueue[RequestOutput]:
        """A reserved request into the scheduler; its outputs come to the queue."""
        q: queue.SimpleQueue[RequestOutput] = queue.SimpleQueue()
        req.sink = q.put
        self._enqueue(req)
        return q

    def _collect(self, q: queue.SimpleQueue[RequestOutput]) -> Accumulator:
        acc = Accumulator()
        while True:
            out = self._get(q)
            acc.add(out)
            if out.finished:
                return acc

    def _stream(self, req: Request) -> Generator[dict[str, Any], None, None]:
        self.admission.reserve(1)
        q = self._submit(req)
        done = False
        try:
            while not done:
                out = self._get(q)
                done = out.finished
                yield out.as_chunk()
        finally:
            if not done:  # the consumer stopped early: free the request's KV
                self.abort(req.rid)

    def _asubmit(self, req: Request) -> asyncio.Queue[RequestOutput]:
        """A reserved request into the scheduler; its outputs come to a queue of the
        running event loop."""
        q = self._aqueue(req)
        self._enqueue(req)
        return q

    def _aqueue(self, req: Request) -> asyncio.Queue[RequestOutput]:
        """`req`'s sink: a queue of the running event loop, which this returns."""
        loop = asyncio.get_running_loop()
        mailbox = self._mailboxes.get(loop)
        if mailbox is None:
            mailbox = self._mailboxes[loop] = Mailbox(loop)
        q: asyncio.Queue[RequestOutput] = asyncio.Queue()
        req.sink = functools.partial(mailbox.put, q)
        return q

    async def _arun(self, reqs: list[Request]) -> list[Accumulator]:
        """Reserve, submit and collect `reqs`; cancelling the caller (a client went away)
        aborts every one of them."""
        self.admission.reserve(len(reqs))
        for r in reqs:
            r.delivery = Delivery.LAST  # collected whole: one output when it ends
        queues = [self._aqueue(r) for r in reqs]
        self._enqueue_all(reqs)
        try:
            return [await self._acollect(q) for q in queues]
        except BaseException:
            for r in reqs:
                self.abort(r.rid)
            raise

    async def _acollect(self, q: asyncio.Queue[RequestOutput]) -> Accumulator:
        acc = Accumulator()
        while True:
            out = await self._aget(q)
            acc.add(out)
            if out.finished:
                return acc

    async def _astream(
        self, req: Request, compiles: list[Future[None]]
    ) -> AsyncIterator[dict[str, Any]]:
        async for out in self._aoutputs(req, compiles):
            yield out.as_chunk()

    async def _aoutputs(
        self, req: Request, compiles: list[Future[None]]
    ) -> AsyncIterator[RequestOutput]:
        for compiled in compiles:
            await asyncio.wrap_future(compiled)
        self.admission.reserve(1)
        q = self._asubmit(req)
        done = False
        try:
            while not done:
                out = await self._aget(q)
                # A consumer that fell behind takes what queued up as one chunk: under
                # load, fewer and larger messages instead of a backlog of small ones.
                while not out.finished and not q.empty():
                    out = out.then(q.get_nowait())
                done = out.finished
                yield out
        finally:
            if not done:
                self.abort(req.rid)

    # ---- the scheduler thread -------------------------------------------------------

    def _post(self, cmd: Command) -> None:
        if self._fatal is not None or not self._thread.is_alive():
            raise Unavailable(self._fatal or "the engine is shut down")
        self._inbox.put(cmd)

    def _check_alive(self) -> None:
        """Waiters poll this: a dead scheduler thread (or TP rank) must not leave them
        hanging. A TP failure counts at once: the scheduler thread may still be stuck
        in a collective with the dead rank."""
        if self._fatal is not None or not self._thread.is_alive():
            raise Unavailable(self._fatal or "the engine is shut down")

    def _on_rank_failure(self, message: str) -> None:
        """From the TP watchdog thread: fail every waiter, end the scheduler thread."""
        self._fatal = message
        self._inbox.put(RankFailed(message))  # wakes an idle scheduler thread, which ends

    def _get(self, q: queue.SimpleQueue[RequestOutput]) -> RequestOutput:
        while True:
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                self._check_alive()

    async def _aget(self, q: asyncio.Queue[RequestOutput]) -> RequestOutput:
        return await next_item(q, _POLL_S, self._check_alive)

    def _ask(self, query: Query) -> Any:
        """Post a query and wait for its answer (or for the scheduler thread to die)."""
        self._post(query)
        while True:
            try:
                return query.reply.result(timeout=_POLL_S)
            except FutureTimeout:
                self._check_alive()

    def _loop(self) -> None:
        try:
            self._serve()
        except RankFailure as e:
            self._fatal = f"the worker's tensor-parallel group failed: {e}"
            logger.error("%s", self._fatal)
        except BaseException as e:  # e.g. a device error inside fail_all itself
            self._fatal = f"the engine's scheduler stopped: {type(e).__name__}: {e}"
            logger.exception("scheduler thread died")

    def _serve(self) -> None:
        sched = self.worker.scheduler
        while True:
            block = not sched.has_work()
            try:
                cmd: Command | None = self._inbox.get(block=block)
            except queue.Empty:
                cmd = None
            while cmd is not None:
                if isinstance(cmd, Stop):
                    return
                handle(self.worker, cmd)
                try:
                    cmd = self._inbox.get_nowait()
                except queue.Empty:
                    cmd = None
            if sched.has_work():
                try:
                    sched.step()
                except RankFailure:
                    raise
                except Exception as e:  # a failed step must not wedge the engine
                    followers = self.worker.followers
                    if followers is not None:  # the TP ranks are out of step: fatal
                        raise RankFailure(
                            followers.failure or f"tensor-parallel step failed: {e!r}"
                        ) from e
                    logger.exception("scheduler step failed")
                    sched.fail_all(f"internal error: {type(e).__name__}: {e}")


_POLL_S = 0.5  # how often a waiter checks that the scheduler thread is alive
_PREFILL_ONLY = SamplingParams(max_new_tokens=0)  # embedding requests sample nothing


def _embedding_dict(out: RequestOutput) -> dict[str, Any]:
    """An embedding request's result at the Python API's edge: {"embedding", "meta_info"}."""
    return {"embedding": embedding_of(out), "meta_info": out.meta_info.to_dict()}

"""An `Engine` in a child process, behind the API the worker's gRPC server uses.

The scheduler is host-bound at large batches: a decode step of 256 requests spends more
time in Python (scheduling, sampling bookkeeping, detokenizing) than on the GPU. In one
process, the gRPC event loop that streams those 256 tokens a step shares the scheduler
thread's interpreter lock, and its per-message work is added to every step (the worker
served 55% of the offline engine's throughput that way on an H200: docs/performance.md).
So the worker runs its engine in a child process, as SGLang and vLLM run their engine
cores apart from their API servers: the server process owns the sockets, the child owns
the model and the scheduler, and they talk over two pipes.

- commands (server -> child): submit (a generation, or an embedding with its pooling),
  abort, abort_all, drain, call (flush, stats, cache snapshot), shutdown. The child
  validates a submission on a thread of its own pool and answers a bad one with its
  error; a constraint compiles in the engine's compile processes meanwhile, with no
  thread waiting for it. Score sends one submission per continuation, so that a
  cancelled score aborts every one of them.
- results (child -> server): one message per burst: everything the scheduler produced
  since the last send (a step's outputs for every running request, cache events, call
  results), in order. A reader thread in the server routes each output to its stream's
  asyncio queue, one loop wake-up per burst, and calls the cache listener with the events
  in the order the radix cache fired them.

Every message is typed, and encoded with msgpack as a fixed-order array (not pickled):
`radixmesh/worker/pipe.py` lists them and says why.

The child ignores SIGINT / SIGTERM (the server drains, then sends shutdown) and exits when
its command pipe closes, so a killed server never leaves an engine behind. A dead child
makes `fatal` say so; every open stream then ends with `Unavailable`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import os
import signal
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from radixmesh import log_limit, redact
from radixmesh.errors import (
    InvalidArgument,
    RadixMeshError,
    Unavailable,
    entry_for,
    error_from_status,
)
from radixmesh.worker.config import EngineConfig
from radixmesh.worker.engine_info import EngineInfo
from radixmesh.worker.kvcache.events import CacheEvent, CacheListener
from radixmesh.worker.mailbox import next_item
from radixmesh.worker.pipe import (
    Abort,
    AbortAll,
    Call,
    Command,
    Drain,
    Error,
    Event,
    Failed,
    Fatal,
    FrameError,
    Out,
    PackedError,
    Raise,
    Ready,
    Result,
    ResultMessage,
    Shutdown,
    Submit,
    decode_command,
    decode_results,
    encode_command,
    encode_results,
)
from radixmesh.worker.request_output import Delivery, RequestOutput, embedding_of
from radixmesh.worker.score import score_of, score_requests

if TYPE_CHECKING:
    from radixmesh.worker.engine import Engine

logger = logging.getLogger(__name__)

Stamp = Callable[[], int]
_POLL_S = 0.5  # how often a waiter checks that the child is alive


# ---- errors across the pipe ----------------------------------------------------------------


def _pack(e: BaseException) -> PackedError:
    """An exception as plain values (our errors' constructors take extra arguments, so
    they do not pickle): gRPC status name, message, field."""
    if not isinstance(e, RadixMeshError | ValueError):
        return "INTERNAL", f"{type(e).__name__}: {e}", None
    return entry_for(e).grpc_status, str(e), getattr(e, "field", None)


def _unpack(packed: PackedError) -> RadixMeshError:
    error = error_from_status(*packed)
    error.grpc_status = None  # raised here, not rebuilt from a client's status
    return error


# ---- the server's side ---------------------------------------------------------------------


class EngineProcess:
    """`EngineProcess(options)`: start an engine with these `Engine(**options)` options in
    a child process and block until it serves (or raise why it could not start)."""

    def __init__(self, options: dict[str, Any], *, start_method: str = "spawn") -> None:
        ctx: Any = mp.get_context(start_method)
        cmd_read, self._cmd = ctx.Pipe(duplex=False)
        self._out, out_write = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_child_main,
            args=(cmd_read, out_write, options),
            name="radixmesh-engine",
            daemon=False,
        )
        self._proc.start()
        cmd_read.close()
        out_write.close()
        self._send_lock = threading.Lock()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._calls: dict[int, tuple[Future[Any], Stamp | None]] = {}
        self._call_ids = itertools.count()
        self._listeners: list[CacheListener] = []
        self._fatal: str | None = None
        self._draining = False
        first = self._recv_first()
        self.config: EngineConfig = first.config
        self.info: EngineInfo = first.info
        self.tokenizer = _tokenizer(self.info, options.get("download_dir"))
        self._reader = threading.Thread(target=self._read, name="radixmesh-engine-reader")
        self._reader.daemon = True
        self._reader.start()

    def _recv_first(self) -> Ready:
        try:
            first = decode_results(self._out.recv_bytes())
        except EOFError:
            self._proc.join(timeout=10)
            raise Unavailable(
                f"the engine process exited while starting (status {self._proc.exitcode})"
            ) from None
        except FrameError as e:
            self._proc.kill()
            raise Unavailable(f"the engine process did not start: {e}") from None
        if len(first) == 1 and isinstance(first[0], Failed):
            self._proc.join(timeout=30)
            raise _unpack(first[0].error)
        assert len(first) == 1 and isinstance(first[0], Ready), first
        return first[0]

    # ---- the API the server uses (the same as Engine's) ------------------------------------

    def async_stream(
        self,
        input_ids: list[int],
        sampling_params: dict[str, Any],
        rid: str | None = None,
        delivery: Delivery = Delivery.STEPS,
    ) -> AsyncIterator[RequestOutput]:
        """Stream one request's outputs (each step's, or those `delivery` names); a bad one
        raises its error at the first iteration."""
        if self._draining:
            raise Unavailable("the worker is draining: it takes no new requests")
        self._check_alive()
        return self._astream(
            list(input_ids), dict(sampling_params), rid or uuid.uuid4().hex, None, delivery
        )

    async def async_encode(
        self, input_ids: list[int], pooling: str = "mean", rid: str | None = None
    ) -> RequestOutput:
        """An embedding (see `Engine.async_encode`): the request's final output, whose
        `embedding` is set (else RequestAborted); cancelling the caller aborts it."""
        if self._draining:
            raise Unavailable("the worker is draining: it takes no new requests")
        self._check_alive()
        joined: RequestOutput | None = None
        stream = self._astream(list(input_ids), {}, rid or uuid.uuid4().hex, pooling)
        async for out in stream:
            joined = out if joined is None else joined.then(out)
        assert joined is not None  # a stream ends with its finished output
        embedding_of(joined)
        return joined

    async def async_score(
        self, input_ids: list[int], continuations: list[list[int]]
    ) -> list[list[float]]:
        """See `Engine.async_score`; cancelling it aborts every continuation's request."""
        prompts, params = score_requests(input_ids, continuations)
        base = uuid.uuid4().hex

        async def one(i: int, ids: list[int]) -> list[float]:
            last = None
            async for out in self.async_stream(ids, params, f"{base}-{i}"):
                last = out
            assert last is not None  # a stream ends with its finished output
            return score_of(last.meta_info)

        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))

    def abort(self, rid: str) -> None:
        self._send(Abort(rid))

    def abort_all(self, reason: str = "aborted") -> None:
        self._send(AbortAll(reason))

    def flush_cache(self) -> bool:
        return bool(self._wait(self._call("flush_cache")))

    def get_stats(self) -> Any:
        return self._wait(self._call("get_stats"))

    def drain(self) -> None:
        self._draining = True
        self._send(Drain())

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def fatal(self) -> str | None:
        return self._fatal

    def add_cache_listener(self, fn: CacheListener) -> None:
        """fn gets every cache event, in order, on the reader thread (hand it on only)."""
        self._listeners.append(fn)

    def cache_snapshot(self, stamp: Stamp) -> tuple[int, list[CacheEvent]]:
        """The radix cache's contents and `stamp()` taken right after the last event that
        they include was delivered to the listeners (so a listener's count stamps them)."""
        return tuple(self._wait(self._call("cache_snapshot", stamp=stamp)))

    def shutdown(self) -> None:
        if self._proc.is_alive():
            self._send(Shutdown())
            self._proc.join(timeout=60)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._cmd.close()

    # ---- plumbing --------------------------------------------------------------------------

    async def _astream(
        self,
        ids: list[int],
        params: dict[str, Any],
        rid: str,
        pooling: str | None = None,
        delivery: Delivery = Delivery.STEPS,
    ) -> AsyncIterator[RequestOutput]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Any] = asyncio.Queue()
        if rid in self._streams:
            raise InvalidArgument("request_id", f"request {rid!r} is already in flight")
        self._streams[rid] = (loop, q)
        done = False
        try:
            self._send(Submit(rid, ids, params, pooling, delivery.value))
            while not done:
                out = await self._next(q)
                while not out.finished and not q.empty():
                    nxt = q.get_nowait()
                    if isinstance(nxt, BaseException):
                        raise nxt
                    out = out.then(nxt)
                done = out.finished
                yield out
        finally:
            self._streams.pop(rid, None)
            if not done:
                self.abort(rid)

    async def _next(self, q: asyncio.Queue[Any]) -> RequestOutput:
        item = await next_item(q, _POLL_S, self._check_alive)
        if isinstance(item, BaseException):
            raise item
        return item

    def _check_alive(self) -> None:
        if self._fatal is not None:
            raise Unavailable(self._fatal)

    def _send(self, msg: Command) -> None:
        self._check_alive()
        frame = encode_command(msg)  # InvalidArgument: a submission msgpack cannot carry
        try:
            with self._send_lock:
                self._cmd.send_bytes(frame)
        except (OSError, EOFError, ValueError) as e:  # the child is gone
            raise Unavailable(f"the engine process is gone: {e}") from None

    def _call(self, name: str, *args: Any, stamp: Stamp | None = None) -> Future[Any]:
        fut: Future[Any] = Future()
        cid = next(self._call_ids)
        self._calls[cid] = (fut, stamp)
        try:
            self._send(Call(cid, name, args))
        except Unavailable as e:
            self._calls.pop(cid, None)
            fut.set_exception(e)
        except BaseException:  # arguments the pipe cannot carry
            self._calls.pop(cid, None)
            raise
        return fut

    def _wait(self, fut: Future[Any]) -> Any:
        while True:
            try:
                return fut.result(timeout=_POLL_S)
            except TimeoutError:
                self._check_alive()

    def _read(self) -> None:
        """The reader thread: route every result the child sends, until it is gone."""
        try:
            while True:
                self._dispatch(decode_results(self._out.recv_bytes()))
        except (EOFError, OSError):
            pass
        except FrameError as e:  # a bug, not a load: the child's results can't be trusted
            logger.error("%s; stopping the engine process", e)
            self._fatal = f"the engine process sent a frame that does not decode ({e})"
            self._proc.kill()
        self._proc.join(timeout=5)
        status = self._proc.exitcode
        self._fatal = self._fatal or f"the engine process exited (status {status})"
        error = Unavailable(self._fatal)
        for fut, _ in list(self._calls.values()):
            if not fut.done():
                fut.set_exception(error)
        for loop, q in list(self._streams.values()):
            loop.call_soon_threadsafe(q.put_nowait, error)

    def _dispatch(self, batch: list[ResultMessage]) -> None:
        wakes: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Any], Any]]] = {}
        for item in batch:
            if isinstance(item, Out | Error):
                stream = self._streams.get(item.rid)
                if stream is not None:
                    value = item.output if isinstance(item, Out) else _unpack(item.error)
                    wakes.setdefault(stream[0], []).append((stream[1], value))
            elif isinstance(item, Event):
                for fn in self._listeners:
                    fn(item.event)
            elif isinstance(item, Result | Raise):
                fut, stamp = self._calls.pop(item.cid)
                if isinstance(item, Raise):
                    fut.set_exception(_unpack(item.error))
                else:
                    value = item.value
                    fut.set_result((stamp(), value) if stamp is not None else value)
            elif isinstance(item, Fatal):
                self._fatal = item.message
        for loop, items in wakes.items():  # one wake-up per loop for the whole burst
            loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list[tuple[asyncio.Queue[Any], Any]]) -> None:
    for q, value in items:
        q.put_nowait(value)


def _tokenizer(info: EngineInfo, download_dir: str | None) -> Any:
    """The server's own copy of the engine's tokenizer (for text inputs and chats): the
    files the engine loaded, with the template it uses."""
    from radixmesh.tokenizer import tokenizer_for

    return tokenizer_for(
        info.tokenizer_spec,
        vocab_size=info.vocab_size,
        eos_token_ids=info.eos_ids,
        bos_token_id=info.bos_token_id,
        download_dir=download_dir,
        chat_template=info.chat_template or None,
    )


# ---- the child's side ----------------------------------------------------------------------


class _Outbox:
    """What the child has for the server, sent in bursts by one sender thread: the
    scheduler thread only appends (a lock and a list), it never waits on the pipe."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._items: list[ResultMessage] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="radixmesh-outbox", daemon=True)
        self._thread.start()

    def put(self, item: ResultMessage) -> None:
        with self._cond:
            self._items.append(item)
            if len(self._items) == 1:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    self._cond.wait()
                items, self._items = self._items, []
                closed = self._closed
            if items:
                try:
                    self.conn.send_bytes(_encoded(items))
                except (OSError, EOFError):
                    return  # the server is gone; the command loop sees it too
            if closed:
                return


def _encoded(items: list[ResultMessage]) -> bytes:
    """The burst's frame; a result that cannot be encoded (a call's value that does not
    pickle: a bug) makes the engine fatal, rather than leave the server waiting."""
    try:
        return encode_results(items)
    except Exception as e:
        logger.exception("a result for the engine pipe does not encode")
        return encode_results([Fatal(f"the engine sent a result it cannot encode: {e!r:.200}")])


def _child_main(cmd: Connection, out: Connection, options: dict[str, Any]) -> None:
    # The server process handles signals (it drains, then sends shutdown); Ctrl-C in a
    # terminal reaches the whole process group, and must not kill the engine under it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log_limit.configure(logging.INFO)  # as the server's: bounded and redacted lines
    redact.install()
    # tqdm's default lock is a multiprocessing one, whose semaphore the child's os._exit
    # would leave to the resource tracker (a "leaked semaphore" warning at every stop).
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    from radixmesh.worker.engine import Engine

    try:
        engine = Engine(**options)
    except BaseException as e:
        out.send_bytes(encode_results([Failed(_pack(e))]))
        return
    # The Engine froze what start-up built out of the collector (`gc_freeze`, the default).
    outbox = _Outbox(out)
    engine.add_cache_listener(lambda ev: outbox.put(Event(ev)))
    out.send_bytes(encode_results([Ready(engine.config, engine.info)]))
    _serve_commands(engine, cmd, outbox)
    outbox.close()
    os._exit(0)  # TP followers and pools are down; skip interpreter teardown


def _serve_commands(engine: Engine, cmd: Connection, outbox: _Outbox) -> None:
    # Validation may compile a grammar (seconds): a pool keeps the command loop free, with
    # a few threads so one slow compile does not hold up other requests' admission. Calls
    # (stats, cache snapshot, flush) have a pool of their own: behind a burst of thousands
    # of submissions in one queue, the load read for a health poll waited for seconds.
    pool = ThreadPoolExecutor(4, thread_name_prefix="radixmesh-engine-cmd")
    calls = ThreadPoolExecutor(2, thread_name_prefix="radixmesh-engine-call")
    submissions = _Submissions()
    watch = threading.Thread(target=_watch_fatal, args=(engine, outbox), daemon=True)
    watch.start()
    try:
        while True:
            try:
                msg = decode_command(cmd.recv_bytes())
            except (EOFError, OSError):
                return  # the server is gone
            except FrameError as e:  # a bug: stop, and the server sees the engine exit
                logger.error("%s; stopping the engine", e)
                return
            if isinstance(msg, Submit):
                submissions.start(msg.rid)
                pool.submit(_submit, engine, outbox, submissions, *msg)
            elif isinstance(msg, Abort):
                if not submissions.abort_later(msg.rid):
                    engine.abort(msg.rid)
            elif isinstance(msg, AbortAll):
                engine.abort_all(msg.reason)
            elif isinstance(msg, Drain):
                engine.drain()
            elif isinstance(msg, Call):
                calls.submit(_run_call, engine, outbox, *msg)
            elif isinstance(msg, Shutdown):
                return
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        calls.shutdown(wait=False, cancel_futures=True)
        engine.shutdown()


class _Submissions:
    """Submissions still on the pool's threads: an abort that overtakes its submission
    (the command loop handles it at once) is applied once the request is in the engine."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, bool] = {}  # rid -> aborted meanwhile

    def start(self, rid: str) -> None:
        with self._lock:
            self._pending[rid] = False

    def abort_later(self, rid: str) -> bool:
        with self._lock:
            if rid not in self._pending:
                return False
            self._pending[rid] = True
            return True

    def done(self, rid: str) -> bool:
        """The submission of `rid` ran; whether it was aborted meanwhile."""
        with self._lock:
            return self._pending.pop(rid, False)


def _submit(
    engine: Engine,
    outbox: _Outbox,
    submissions: _Submissions,
    rid: str,
    ids: list[int],
    params: Any,
    pooling: str | None,
    delivery: str,
) -> None:
    def fail(e: BaseException) -> None:
        outbox.put(Error(rid, _pack(e)))

    try:  # a constraint compiles in the background; `fail` gets its error
        engine.submit(
            ids, params, rid, lambda o: outbox.put(Out(rid, o)), pooling, fail, Delivery(delivery)
        )
    except BaseException as e:
        submissions.done(rid)
        fail(e)
        return
    if submissions.done(rid):
        engine.abort(rid)


def _run_call(engine: Engine, outbox: _Outbox, cid: int, name: str, args: tuple[Any, ...]) -> None:
    try:
        if name == "cache_snapshot":
            # Queued from the scheduler thread itself, right behind the events the snapshot
            # includes and before any later one: the server stamps it in that order.
            engine.call(lambda: outbox.put(Result(cid, engine.worker.cache_snapshot())))
            return
        if name == "flush_cache":
            value: Any = engine.flush_cache()
        elif name == "get_stats":
            value = engine.get_stats()
        else:
            raise ValueError(f"call: the engine process answers {_CALLS}, not {name!r}")
    except BaseException as e:
        outbox.put(Raise(cid, _pack(e)))
        return
    outbox.put(Result(cid, value))


# The engine's methods a `Call` may name.
_CALLS = ("cache_snapshot", "flush_cache", "get_stats")


def _watch_fatal(engine: Engine, outbox: _Outbox) -> None:
    """Tell the server when the engine can no longer serve (a dead scheduler or TP rank)."""
    stop = threading.Event()
    while not stop.wait(0.2):
        if engine.fatal is not None:
            outbox.put(Fatal(engine.fatal))
            return

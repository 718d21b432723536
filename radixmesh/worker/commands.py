"""What an Engine asks of its scheduler thread: one message type each, one handler.

`Engine` methods run on the callers' threads; the worker's state belongs to the
scheduler thread, which carries out these messages between two steps (`handle`). A
message that answers carries the Future its caller waits on; the handler settles it with
the value or the exception. `Stop` ends the thread after the messages before it;
`RankFailed` (posted by the tensor-parallel watchdog) ends it with the failure.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixmesh.worker.constrained.compile_cache import GrammarEventKind
from radixmesh.worker.kvcache.events import CacheEvent, CacheListener
from radixmesh.worker.request import Request
from radixmesh.worker.tp.leader import RankFailure

if TYPE_CHECKING:
    from radixmesh.worker.worker import Worker

ABORTED_BY_CLIENT = "aborted by the client"


@dataclass(frozen=True)
class AddRequest:
    req: Request
    aborted: bool = False  # aborted before it got here: it ends at once, with its output


@dataclass(frozen=True)
class AddRequests:
    """Requests of one call, added between two steps at once: one message instead of
    one each (a batch of 1,024 prompts took as many hand-offs between the threads, and
    the first steps saw whichever had arrived)."""

    reqs: tuple[Request, ...]


@dataclass(frozen=True)
class Abort:
    rid: str
    reason: str = ABORTED_BY_CLIENT


@dataclass(frozen=True)
class AbortAll:
    reason: str


@dataclass(frozen=True)
class GrammarChanged:
    """A grammar entered or left the compile cache (its `announce`, from its threads)."""

    kind: GrammarEventKind
    key: int


@dataclass(frozen=True)
class FlushCache:
    """Empty the radix cache; answers False (nothing done) while requests are in flight."""

    reply: Future[bool] = field(default_factory=Future)


@dataclass(frozen=True)
class GetStats:
    reply: Future[Any] = field(default_factory=Future)


@dataclass(frozen=True)
class CacheSnapshot:
    """The radix cache's contents with `stamp()`, both read where cache events fire."""

    stamp: Callable[[], int]
    reply: Future[tuple[int, list[CacheEvent]]] = field(default_factory=Future)


@dataclass(frozen=True)
class AddCacheListener:
    """Attach `fn`; with `snapshot`, answer the contents taken atomically with it."""

    fn: CacheListener
    snapshot: bool
    reply: Future[list[CacheEvent]] = field(default_factory=Future)


@dataclass(frozen=True)
class Inspect:
    """Run `fn` between steps and answer its value (tests inspect worker state so)."""

    fn: Callable[[], Any]
    reply: Future[Any] = field(default_factory=Future)


@dataclass(frozen=True)
class RankFailed:
    message: str


@dataclass(frozen=True)
class Stop:
    pass


Command = (
    AddRequest
    | AddRequests
    | Abort
    | AbortAll
    | GrammarChanged
    | FlushCache
    | GetStats
    | CacheSnapshot
    | AddCacheListener
    | Inspect
    | RankFailed
    | Stop
)
Query = FlushCache | GetStats | CacheSnapshot | AddCacheListener | Inspect


def handle(worker: Worker, cmd: Command) -> None:
    """Carry out one message on the scheduler thread (`Stop` is the loop's to see)."""
    sched = worker.scheduler
    match cmd:
        case AddRequest(req=req, aborted=aborted):
            sched.add_request(req)
            if aborted:
                sched.abort(req.rid, ABORTED_BY_CLIENT)
        case AddRequests(reqs=reqs):
            for req in reqs:
                sched.add_request(req)
        case Abort(rid=rid, reason=reason):
            sched.abort(rid, reason)
        case AbortAll(reason=reason):
            sched.abort_all(reason)
        case GrammarChanged(kind=kind, key=key):
            worker.announced_grammars.change(kind, key)
        case RankFailed(message=message):
            raise RankFailure(message)
        case Stop():
            pass
        case _:
            _answer(cmd, lambda: _query(worker, cmd))


def _query(worker: Worker, cmd: Query) -> Any:
    match cmd:
        case FlushCache():
            return worker.flush_cache()
        case GetStats():
            return worker.scheduler.stats()
        case CacheSnapshot(stamp=stamp):
            return stamp(), worker.cache_snapshot()
        case AddCacheListener(fn=fn, snapshot=snapshot):
            worker.add_cache_listener(fn)
            return worker.cache_snapshot() if snapshot else []
        case Inspect(fn=fn):
            return fn()


def _answer(cmd: Query, compute: Callable[[], Any]) -> None:
    try:
        cmd.reply.set_result(compute())
    except BaseException as e:  # delivered to the caller
        cmd.reply.set_exception(e)

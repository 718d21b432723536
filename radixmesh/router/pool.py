"""The worker pool: one `WorkerHandle` per worker address.

Each handle owns a gRPC channel and three background tasks on the router's loop:

- a health loop that polls `GetLoad` every `health_interval` seconds (an unhealthy worker
  at least every `UNHEALTHY_PROBE_INTERVAL`): an answer (not draining, its engine heard
  from within `liveness_window`) marks the worker healthy and refreshes its load; a
  refusal, or a timeout after the worker was silent on every channel for
  `liveness_window`, marks it unhealthy and counts against its circuit breaker; a timeout
  while the worker streams is a busy worker, left as it was (liveness.py says why);
- an output reader (outputs.py) that keeps the worker's output stream open and puts each
  chunk in its request's sink;
- a cache-event loop that keeps the worker's `PrefixSummary` exact: it opens
  `StreamCacheEvents`, then pulls `GetCacheSnapshot` and applies the events after it.
  A sequence gap, a new epoch or a broken stream means a resync (reconnect + snapshot).
  The same events carry the keys of the grammars the worker has compiled (`grammars`,
  for cache_aware's grammar affinity); a snapshot sends the whole set.

A worker that can move (a Ray actor restarted on another port or node) comes with a
`Resolver`: while the worker does not answer, the health loop asks it for the current
address at most every `RESOLVE_INTERVAL` and reconnects when the address changed. The
new process has a new event epoch, so the event loop resyncs its summary from a snapshot.

Only this module and the front ends (`control.py`, `dispatch.py`, `service.py`) see protobuf;
the summaries and policies see ints.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import grpc

from radixmesh.client.options import CHANNEL_OPTIONS
from radixmesh.errors import InvalidArgument, Overloaded
from radixmesh.router.breaker import CircuitBreaker
from radixmesh.router.config import DNS_PREFIX, RouterConfig
from radixmesh.router.hot import HotPrefixes
from radixmesh.router.liveness import judge
from radixmesh.router.outputs import OutputReader
from radixmesh.router.policy import Candidate
from radixmesh.router.summary import PrefixSummary, SummaryIndex
from radixmesh.v1 import worker_pb2, worker_pb2_grpc
from radixmesh.wire import load_age, reports_deterministic

logger = logging.getLogger(__name__)

UNHEALTHY_PROBE_INTERVAL = 0.5  # seconds between polls of a worker that is down
# The weight of the other replicas' pending prefill on a worker in this replica's view (its
# own counts in full). The others' requests are known an event delay late, and every
# replica acts on them at once: at full weight, 8 replicas in the router simulator herded
# their spills onto the same workers and the hit rate collapsed (docs/router-sim.md).
SHARED_PENDING_WEIGHT = 0.25
RESOLVE_INTERVAL = 1.0  # seconds between address look-ups of a worker that is down
# Grammar keys kept per worker: a worker's compiled cache holds at most 1,024 grammars
# (compile_cache.py), so this bounds only what a misbehaving worker could make us keep.
MAX_GRAMMARS = 4096

# The worker's current address, or None when it is not known right now.
Resolver = Callable[[], Awaitable[str | None]]


@dataclass
class LoadReport:
    num_running: int = 0
    num_waiting: int = 0
    kv_tokens_used: int = 0
    kv_tokens_total: int = 0
    cache_hit_rate: float = 0.0


class WorkerHandle:
    def __init__(
        self,
        worker_id: str,
        address: str,
        summary: PrefixSummary,
        config: RouterConfig,
        on_grow: Callable[[], None] = lambda: None,
        resolve: Resolver | None = None,
        on_end: Callable[[str], None] | None = None,
    ) -> None:
        self.worker_id = worker_id
        # Called with the worker's id when a request on it ends, this replica's or another's
        # (hot-prefix replication measures a worker's capacity by them).
        self.on_end = on_end
        self.summary = summary
        self.on_grow = on_grow  # called after the summary grew (the pool enforces its budget)
        self.config = config
        self.resolve = resolve
        self._retired: list[grpc.aio.Channel] = []  # channels to a previous address
        self._resolved_at = float("-inf")
        self._connect(address)
        key = config.worker_api_key
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {key}"),) if key else ()
        )
        self.breaker = CircuitBreaker(config.breaker_failures, config.breaker_cooldown)
        # The worker answered a health poll and is not draining, and has not been judged
        # down since (liveness.py).
        self.reachable = False
        # With require_deterministic: the worker answered without reporting deterministic
        # mode, so it stays out of the pool (logged once per refusal).
        self.refused = False
        self.slow_polls = 0  # health polls that timed out while the worker streamed: busy
        self.load = LoadReport()
        self.in_flight = 0  # requests the router has on this worker now
        # Uncached prompt tokens of the router's requests here that have not started
        # streaming (their prefill is queued or running): cache_aware weighs them.
        self.pending_prefill = 0
        self.ended_since_poll = 0  # of the router's requests, those ended since `load` came
        # Other router replicas' requests here, from the worker's request events (a
        # "pending" event naming a request this replica did not send, to its "ended"):
        # request id -> its prompt tokens this replica's summary lacked when it arrived,
        # counted as pending prefill until its "started" event (then 0).
        self.others: dict[str, int] = {}
        self.others_pending = 0
        # Whether `candidate` counts them: behind several replicas (`config.replicas`), whose
        # cache_aware places cold prompts each on its own share of the workers. Without
        # those shares, replicas acting on the same view herd: in the router simulator at
        # 256 workers and 8 replicas, counting them then lowered the hit rate 4.8 points.
        self.count_others = config.replicas > 1
        # Until then (time.monotonic()) the worker said it is full: not routed to meanwhile.
        self.full_until = 0.0
        self.resyncs = 0  # snapshot pulls (the first one included)
        self.block_size = 0  # the worker's event block size (from its snapshot)
        # The keys of the grammars the worker has compiled (radixmesh.grammar_key), from its
        # grammar events; replaced by each snapshot's set.
        self.grammars: set[int] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._candidate = Candidate(worker_id, False, 0, 0)  # the last one `candidate` built
        # time.monotonic() of the worker's last word of any kind (an output batch, a chunk, a
        # cache event, a load report as of its engine's read): requests waiting on a worker
        # that speaks are not stalled, and a poll that times out then finds it busy.
        self.last_heard = time.monotonic()
        self.outputs = OutputReader(self)  # its output stream, into the requests' sinks

    def _connect(self, address: str) -> None:
        self.address = address
        c = self.config
        if c.worker_tls_ca is None:
            self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        else:
            options: list[tuple[str, int | str]] = [*CHANNEL_OPTIONS]
            if c.worker_tls_server_name:  # workers found by IP carry a name in their certs
                options.append(("grpc.ssl_target_name_override", c.worker_tls_server_name))
            creds = worker_channel_credentials(c)
            self.channel = grpc.aio.secure_channel(address, creds, options=options)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)

    async def re_resolve(self) -> bool:
        """Ask the resolver where the worker is now; reconnect if it moved. Returns whether
        the address changed. A failing resolver counts as 'not known now'."""
        if self.resolve is None:
            return False
        self._resolved_at = asyncio.get_running_loop().time()
        try:
            address = await self.resolve()
        except Exception as e:  # the resolver is the launcher's code (e.g. a Ray call)
            logger.debug("resolving %s: %r", self.worker_id, e)
            return False
        if address is None or address == self.address:
            return False
        logger.info("worker %s moved: %s -> %s", self.worker_id, self.address, address)
        # Calls on the old channel may still be unwinding in other tasks: close it later.
        self._retired.append(self.channel)
        self._connect(address)
        # A new process starts with an empty cache: forget the old one's blocks now, not
        # at the snapshot the event loop pulls next (epoch 0: never synced).
        self.summary.reset(0, 0, ())
        self.grammars.clear()
        return True

    @property
    def healthy(self) -> bool:
        return self.reachable and self.breaker.allows() and not self.full

    @property
    def full(self) -> bool:
        return self.full_until > 0 and time.monotonic() < self.full_until

    def shed(self, error: Overloaded) -> None:
        """The worker refused a request as overloaded: route around it for as long as it
        said (its Retry-After), so that requests are not sent to it only to be refused."""
        self.full_until = time.monotonic() + max(error.retry_after, 0.0)

    def candidate(
        self, cached_tokens: int, host_cached_tokens: int = 0, has_grammar: bool = False
    ) -> Candidate:
        # The load report lags by up to a health interval and still counts requests that
        # ended since: without subtracting them, a chat's next turn saw its own finished
        # turn as queued work on the worker caching it, and went to a cold worker.
        load = self.load
        reported = load.num_running + load.num_waiting - self.ended_since_poll
        tracked = self.in_flight + len(self.others) if self.count_others else self.in_flight
        queued = max(reported, tracked)
        healthy = self.reachable and self.breaker.allows() and not self.full
        # Reused while unchanged: the router builds one per worker per request, and most
        # workers' candidates are the same as for the last request.
        c = self._candidate
        pending = self.pending_prefill
        if self.others_pending and self.count_others:
            pending += int(SHARED_PENDING_WEIGHT * self.others_pending)
        if (
            c.cached_tokens != cached_tokens
            or c.queued != queued
            or c.healthy != healthy
            or c.pending_prefill != pending
            or c.host_cached_tokens != host_cached_tokens
            or c.has_grammar != has_grammar
        ):
            c = Candidate(
                self.worker_id,
                healthy,
                cached_tokens,
                queued,
                pending,
                host_cached_tokens,
                has_grammar,
            )
            self._candidate = c
        return c

    def request_started(self, pending_prefill: int) -> None:
        """One of the router's requests, with this many uncached prompt tokens, was sent."""
        self.in_flight += 1
        self.pending_prefill += pending_prefill

    def request_streaming(self, pending_prefill: int) -> None:
        """That request's first chunk came back (or it ended before one did)."""
        self.pending_prefill -= pending_prefill

    def request_ended(self) -> None:
        """One of the router's requests on this worker ended (however it ended)."""
        self.in_flight -= 1
        self.ended_since_poll += 1
        if self.on_end is not None:
            self.on_end(self.worker_id)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._health_loop()),
            asyncio.create_task(self._event_loop()),
        ]
        if not self.config.per_request_streams:
            self._tasks.append(asyncio.create_task(self.outputs.run(self.config.health_interval)))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in [*self._retired, self.channel]:
            await channel.close()

    # ---- health -------------------------------------------------------------------------

    async def poll(self) -> bool:
        """One GetLoad: refresh load and health (liveness.py's rule). Returns whether the
        worker is healthy."""
        # Requests that end while the poll is in flight may still be in its report: keep
        # counting them as ended (at worst the report is undercounted; in_flight bounds it).
        ended_before = self.ended_since_poll
        window = self.config.liveness_window
        try:
            call = self.stub.GetLoad(
                worker_pb2.GetLoadRequest(),
                timeout=self.config.health_timeout,
                metadata=self.metadata,
            )
            resp = await call
            trailers = await call.trailing_metadata()
            age = load_age(trailers)
        except grpc.aio.AioRpcError as e:
            silent_for = time.monotonic() - self.last_heard
            if judge(e.code(), silent_for, window) == "busy":
                self.slow_polls += 1
                logger.debug("worker %s is slow to answer (%s): busy", self.worker_id, e.code())
                return self.healthy
            self._down(f"{e.code().name}, silent for {silent_for:.1f} s")
            return False
        self.load = LoadReport(
            resp.num_running,
            resp.num_waiting,
            resp.kv_tokens_used,
            resp.kv_tokens_total,
            resp.cache_hit_rate,
        )
        self.ended_since_poll -= ended_before
        now = time.monotonic()
        self.last_heard = max(self.last_heard, now - age)
        if judge(None, now - self.last_heard, window) == "down":
            self._down(f"its engine has said nothing for {now - self.last_heard:.1f} s")
            return False
        if self.config.require_deterministic and not reports_deterministic(trailers):
            if not self.refused:
                logger.error(
                    "worker %s (%s) refused: the router requires deterministic workers "
                    "(require_deterministic) and it does not run with --deterministic",
                    self.worker_id,
                    self.address,
                )
            self.refused = True
            self.reachable = False
            return False
        if self.refused:
            logger.info("worker %s (%s) is deterministic now", self.worker_id, self.address)
            self.refused = False
        self.reachable = not resp.draining
        if self.reachable:
            self.breaker.record_success()
        return self.reachable

    def _down(self, why: str) -> None:
        if self.reachable:
            logger.warning("worker %s (%s) is down: %s", self.worker_id, self.address, why)
        self.reachable = False
        self.breaker.record_failure()

    async def _health_loop(self) -> None:
        # An unhealthy worker is probed more often, so that it rejoins soon after it is up.
        loop = asyncio.get_running_loop()
        while True:
            healthy = await self.poll()
            due = loop.time() - self._resolved_at >= RESOLVE_INTERVAL
            if not healthy and due and await self.re_resolve():
                healthy = await self.poll()
            interval = self.config.health_interval
            await asyncio.sleep(interval if healthy else min(interval, UNHEALTHY_PROBE_INTERVAL))

    # ---- cache events -------------------------------------------------------------------

    async def _event_loop(self) -> None:
        while True:
            try:
                await self._follow_events()
            except grpc.aio.AioRpcError as e:
                logger.debug("cache events of %s: %s", self.worker_id, e.code().name)
            await asyncio.sleep(self.config.health_interval)

    async def _follow_events(self) -> None:
        """Subscribe, sync from a snapshot, then apply events until the stream ends."""
        call = self.stub.StreamCacheEvents(
            worker_pb2.StreamCacheEventsRequest(), metadata=self.metadata
        )
        try:
            await self.resync()
            async for resp in call:
                self.last_heard = time.monotonic()
                ev = resp.event
                s = self.summary
                if ev.epoch == s.epoch and ev.sequence <= s.sequence:
                    continue  # already in the snapshot
                if ev.epoch != s.epoch or ev.sequence != s.sequence + 1:
                    logger.info("cache events of %s: gap or new epoch; resync", self.worker_id)
                    await self.resync()
                    if ev.epoch != s.epoch or ev.sequence <= s.sequence:
                        continue
                    if ev.sequence != s.sequence + 1:
                        return  # still a gap: resubscribe
                self.apply(ev)
        finally:
            call.cancel()

    def apply(self, ev: worker_pb2.CacheEvent) -> None:
        s = self.summary
        kind = ev.kind
        if kind == worker_pb2.CACHE_EVENT_KIND_STORED or kind == worker_pb2.CACHE_EVENT_KIND_LOADED:
            s.store(ev.block_hashes)
            self.on_grow()
        elif kind == worker_pb2.CACHE_EVENT_KIND_REMOVED:
            s.remove(ev.block_hashes)
        elif kind == worker_pb2.CACHE_EVENT_KIND_OFFLOADED:
            s.offload(ev.block_hashes)
            self.on_grow()  # (only when the summary had forgotten some of the blocks)
        elif kind == worker_pb2.CACHE_EVENT_KIND_CLEARED:
            s.clear()
        elif kind == worker_pb2.CACHE_EVENT_KIND_PENDING:
            if ev.request_id:  # (before its blocks count as tentative: what it prefills)
                self._arrived(ev.request_id, ev.block_hashes)
            # Another replica (or this one) routed a request here: count its prefix as
            # on its way, as the replica that routed it does.
            s.add_tentative(ev.block_hashes, self.config.tentative_ttl)
            self.on_grow()
        elif kind == worker_pb2.CACHE_EVENT_KIND_REQUEST_STARTED:
            estimate = self.others.get(ev.request_id)
            if estimate:
                self.others_pending -= estimate
                self.others[ev.request_id] = 0
        elif kind == worker_pb2.CACHE_EVENT_KIND_REQUEST_ENDED:
            estimate = self.others.pop(ev.request_id, None)
            if estimate is not None:
                self.others_pending -= estimate
                self.ended_since_poll += 1  # (the next load report no longer counts it)
                if self.on_end is not None:
                    self.on_end(self.worker_id)
        elif kind == worker_pb2.CACHE_EVENT_KIND_GRAMMAR_COMPILED:
            self._add_grammars(ev.grammar_keys)
        elif kind == worker_pb2.CACHE_EVENT_KIND_GRAMMAR_EVICTED:
            self.grammars.difference_update(ev.grammar_keys)
        s.sequence = ev.sequence

    def _arrived(self, request_id: str, hashes: Sequence[int]) -> None:
        """A request reached the worker. This replica's own requests (those with a sink
        here) it counts from its decision on; another replica's it counts from now, with
        the prompt tokens its summary of the worker lacks as pending prefill."""
        if request_id in self.outputs.sinks:
            return
        estimate = (len(hashes) - self.summary.match(hashes)) * self.block_size
        self.others[request_id] = estimate
        self.others_pending += estimate

    def _add_grammars(self, keys: Iterable[int]) -> None:
        for key in keys:
            if len(self.grammars) >= MAX_GRAMMARS:
                return
            self.grammars.add(key)

    def forget_others(self) -> None:
        """Events were missed (a resync): the other replicas' requests are not known now
        (their ends may be among the lost events); the load polls count them meanwhile."""
        self.others.clear()
        self.others_pending = 0

    async def resync(self) -> None:
        snap = await self.stub.GetCacheSnapshot(
            worker_pb2.GetCacheSnapshotRequest(),
            timeout=self.config.health_timeout * 5,
            metadata=self.metadata,
        )
        device, host = snapshot_tiers(snap.events)
        self.summary.reset(snap.epoch, snap.sequence, device, host)
        self.grammars.clear()
        for ev in snap.events:
            if ev.kind == worker_pb2.CACHE_EVENT_KIND_GRAMMAR_COMPILED:
                self._add_grammars(ev.grammar_keys)
        self.forget_others()
        self.on_grow()
        self.block_size = snap.block_size
        self.resyncs += 1


class WorkerPool:
    """`resolvers`, if given, has one `Resolver` per address of `config.workers`.

    With `config.hot_prefix_replication`, `hot` keeps the hot prefixes and the workers'
    finished requests (their measured capacity) on `clock` (seconds; tests inject one)."""

    def __init__(
        self,
        config: RouterConfig,
        resolvers: Sequence[Resolver] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if resolvers and len(resolvers) != len(config.workers):
            raise InvalidArgument("resolvers", "give one resolver per worker, or none")
        self.config = config
        self.clock = clock
        hot = config.hot_prefixes
        self.hot = HotPrefixes(hot) if hot is not None else None
        self._on_end = self._finished if self.hot is not None else None
        self.index = SummaryIndex(config.summary_budget_bytes)
        self.workers: dict[str, WorkerHandle] = {}
        self._started = False
        for i, address in enumerate(config.workers):
            if address.startswith(DNS_PREFIX):
                continue  # its addresses come and go (router/discovery.py)
            wid = f"worker-{i}"
            resolve = resolvers[i] if resolvers else None
            self.workers[wid] = WorkerHandle(
                wid,
                address,
                self.index.add(wid),
                config,
                self.index.enforce_budget,
                resolve,
                self._on_end,
            )

    def start(self) -> None:
        self._started = True
        for w in self.workers.values():
            w.start()

    def add_worker(self, worker_id: str, address: str) -> WorkerHandle:
        """A worker that appeared (discovery); polled at once if the pool runs."""
        summary = self.index.add(worker_id)
        handle = WorkerHandle(
            worker_id,
            address,
            summary,
            self.config,
            self.index.enforce_budget,
            on_end=self._on_end,
        )
        self.workers[worker_id] = handle
        if self._started:
            handle.start()
        return handle

    def remove_worker(self, worker_id: str) -> WorkerHandle:
        """A worker that went away: no new request is routed to it. The caller closes the
        handle once the requests on it have ended."""
        self.index.summaries.pop(worker_id, None)
        if self.hot is not None:
            self.hot.forget_worker(worker_id)
        return self.workers.pop(worker_id)

    def _finished(self, worker_id: str) -> None:
        assert self.hot is not None
        self.hot.finished(worker_id, self.clock())

    async def close(self) -> None:
        await asyncio.gather(*(w.close() for w in self.workers.values()))

    async def wait_healthy(self, timeout: float) -> bool:
        """Poll until some worker is healthy (or `timeout` passes)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            results = await asyncio.gather(*(w.poll() for w in self.workers.values()))
            if any(results):
                return True
            await asyncio.sleep(0.2)
        return False


def worker_channel_credentials(c: RouterConfig) -> grpc.ChannelCredentials:
    """TLS to workers: their CA, and the router's own certificate when they require one."""
    assert c.worker_tls_ca is not None

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_channel_credentials(
        read(c.worker_tls_ca), read(c.worker_tls_key), read(c.worker_tls_cert)
    )


def snapshot_blocks(events: Iterable[worker_pb2.CacheEvent]) -> set[int]:
    """The block hashes a worker's cache snapshot (its events, in order) leaves on the device."""
    return snapshot_tiers(events)[0]


def snapshot_tiers(events: Iterable[worker_pb2.CacheEvent]) -> tuple[set[int], set[int]]:
    """The block hashes a snapshot's events (in order) leave on the device, and those they
    leave only in host memory (the worker's `replay_tiers`, over protobuf events)."""
    device: set[int] = set()
    host: set[int] = set()
    for ev in events:
        kind, hashes = ev.kind, ev.block_hashes
        if kind == worker_pb2.CACHE_EVENT_KIND_STORED or kind == worker_pb2.CACHE_EVENT_KIND_LOADED:
            device.update(hashes)
            host.difference_update(hashes)
        elif kind == worker_pb2.CACHE_EVENT_KIND_OFFLOADED:
            device.difference_update(hashes)
            host.update(hashes)
        elif kind == worker_pb2.CACHE_EVENT_KIND_REMOVED:
            device.difference_update(hashes)
            host.difference_update(hashes)
        elif kind == worker_pb2.CACHE_EVENT_KIND_CLEARED:
            device.clear()
            host.clear()
    return device, host

"""Hot prefixes: a prefix whose requests outrun one worker is placed on several.

cache_aware keeps a prefix's requests on the worker caching it until that worker's queue
costs more than prefilling the whole prefix elsewhere: the right trade for one request,
but for a prefix that brings most of the traffic a copy's prefill serves many requests,
and with a long prefix the holder's queue grows past its batch (decode-bound waiting)
before one spills. `HotPrefixes` notices such a prefix and gives it a set of home workers
(Preble's replication of hot prefixes): its requests go to the cheapest of its homes, or
to a new one where a copy would be cheaper.

The rule (docs/router-sim.md, "Hot prefixes"):

- A prefix is the prompt's block hash at depth `key_blocks` (or its last block, if
  shorter): prompts sharing their first `key_blocks` blocks share a prefix.
- Its load is its requests over the last `window_s` seconds, per second.
- A worker's capacity is measured, not configured: the most requests any one worker
  finished in one window, per second, over the run.
- A prefix is hot once its load passes `utilization` x capacity (one worker would run it
  full); cache_aware's pick at that moment is its first home.
- A hot prefix's request goes where cache_aware's cost is least when each home counts as
  caching the whole prompt and every other worker as prefilling `new_home_prefill` of
  what it lacks (the copy's prefill, shared with the requests that follow it there);
  a worker so chosen that is not a home becomes one (at most `max_homes`).
- A hot prefix loses its last-added home when its load would fit one home fewer at
  `shrink_utilization` x capacity each (lower than `utilization`: a prefix at the boundary
  does not flap); with one home, it is no longer hot once its load is below that share.

Pure bookkeeping on a caller-given clock: the router calls it from its one event loop,
the simulator on simulated time. `place` is the routing step both run on top of
cache_aware's choice, so the router (control.py, `--hot-prefix-replication`) makes the
simulator's decisions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.router.policy import Candidate, Policy


@dataclass(frozen=True)
class HotPrefixConfig:
    window_s: float = 1.0  # the load and the capacity are measured over this window
    utilization: float = 0.8  # a home is full at this share of the measured capacity
    shrink_utilization: float = 0.5  # ... and a home is dropped when the rest stay below it
    max_homes: int = 8
    key_blocks: int = 4  # a prefix: the prompt's block hash at this depth
    # A non-home worker's prefill for a hot prefix's request, as a share of what it lacks
    # (1.0: what cache_aware alone counts; a copy serves the requests after it too).
    new_home_prefill: float = 0.5

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise InvalidArgument("window_s", f"must be > 0, got {self.window_s}")
        if not 0 < self.shrink_utilization < self.utilization <= 1:
            raise InvalidArgument(
                "shrink_utilization",
                f"want 0 < shrink_utilization < utilization <= 1, got "
                f"{self.shrink_utilization} and {self.utilization}",
            )
        if self.max_homes < 1:
            raise InvalidArgument("max_homes", f"must be >= 1, got {self.max_homes}")
        if self.key_blocks < 1:
            raise InvalidArgument("key_blocks", f"must be >= 1, got {self.key_blocks}")
        if not 0 <= self.new_home_prefill <= 1:
            raise InvalidArgument(
                "new_home_prefill", f"must be in [0, 1], got {self.new_home_prefill}"
            )


@dataclass
class HotPrefixStats:
    hot: int = 0  # prefixes with more than one home now
    homes: int = 0  # their homes together
    replications: int = 0  # homes added, since start
    dereplications: int = 0  # homes dropped, since start


class HotPrefixes:
    def __init__(self, config: HotPrefixConfig) -> None:
        self.config = config
        self._arrivals: dict[int, deque[float]] = {}  # prefix -> its recent arrival times
        self._homes: dict[int, list[str]] = {}  # hot prefix -> its homes, oldest first
        self._finished: dict[str, deque[float]] = {}  # worker -> its recent finish times
        self.capacity_rps = 0.0  # the most one worker finished in a window, per second
        self.stats = HotPrefixStats()
        self._swept = 0.0  # when the hot prefixes were last re-checked
        self._first_finish: float | None = None

    def key(self, hashes: Sequence[int]) -> int | None:
        """A prompt's prefix (None for a prompt shorter than one block)."""
        if not hashes:
            return None
        return hashes[min(len(hashes), self.config.key_blocks) - 1]

    def finished(self, worker_id: str, now: float) -> None:
        """A request on `worker_id` ended: its capacity, measured."""
        times = self._finished.setdefault(worker_id, deque())
        times.append(now)
        self._trim(times, now)
        if self._first_finish is None:
            self._first_finish = now
        if now - self._first_finish >= self.config.window_s:  # a whole window measured
            self.capacity_rps = max(self.capacity_rps, len(times) / self.config.window_s)

    def load(self, key: int, now: float) -> float:
        times = self._arrivals.get(key)
        if not times:
            return 0.0
        self._trim(times, now)
        return len(times) / self.config.window_s

    def homes(self, key: int) -> list[str]:
        """The prefix's homes if it is hot now, else []."""
        return self._homes.get(key, [])

    def arrived(self, key: int, now: float, holder: str) -> list[str]:
        """A request for `key` arrived; `holder`: where cache_aware alone would send it.
        Returns the prefix's homes ([]: not hot, route as usual)."""
        times = self._arrivals.setdefault(key, deque())
        times.append(now)
        self._trim(times, now)
        if now - self._swept >= self.config.window_s / 4:
            self._sweep(now, key)
        if not self.capacity_rps:
            return []  # no worker has been measured yet
        load = len(times) / self.config.window_s
        if key in self._homes:
            return self._shrink(key, load)
        if load <= self.config.utilization * self.capacity_rps:
            if len(times) == 1 and len(self._arrivals) > 4096:
                self._forget_cold(now)
            return []
        self._homes[key] = [holder]
        return self._homes[key]

    def _shrink(self, key: int, load: float) -> list[str]:
        """Drop the prefix's last-added home if its load fits one home fewer (with one
        home: if it fits that home at the lower share, the prefix is not hot); its homes
        after ([] once it is not hot)."""
        homes = self._homes[key]
        n = len(homes)
        if load < max(n - 1, 1) * self.config.shrink_utilization * self.capacity_rps:
            if n == 1:
                del self._homes[key]
                return []
            homes.pop()
            self.stats.dereplications += 1
            if n == 2:
                del self._homes[key]
                self._count()
                return []
            self._count()
        return homes

    def _sweep(self, now: float, skip: int) -> None:
        """Re-check the hot prefixes other than `skip` (a prefix that cooled to nothing
        has no arrival to re-check it)."""
        self._swept = now
        for key in [k for k in self._homes if k != skip]:
            self._shrink(key, self.load(key, now))

    def add_home(self, key: int, worker_id: str) -> None:
        homes = self._homes[key]
        if worker_id not in homes:
            homes.append(worker_id)
            self.stats.replications += 1
            self._count()

    def forget_worker(self, worker_id: str) -> None:
        """A worker left the pool: it is no prefix's home."""
        self._finished.pop(worker_id, None)
        for key in list(self._homes):
            homes = self._homes[key]
            if worker_id in homes:
                homes.remove(worker_id)
                if len(homes) < 2:
                    del self._homes[key]
        self._count()

    def _count(self) -> None:
        """The gauges: prefixes placed on more than one home, and those homes."""
        placed = [len(h) for h in self._homes.values() if len(h) > 1]
        self.stats.hot, self.stats.homes = len(placed), sum(placed)

    def _trim(self, times: deque[float], now: float) -> None:
        horizon = now - self.config.window_s
        while times and times[0] <= horizon:
            times.popleft()

    def _forget_cold(self, now: float) -> None:
        """Drop the arrival times of prefixes with none in the window (bounds memory)."""
        for key in [k for k, t in self._arrivals.items() if k not in self._homes]:
            times = self._arrivals[key]
            self._trim(times, now)
            if not times:
                del self._arrivals[key]


def place(
    hot: HotPrefixes,
    policy: Policy,
    key: int,
    now: float,
    prompt_tokens: int,
    candidates: Sequence[Candidate],
    chosen: str,
) -> str:
    """The worker for a request of prefix `key`, given `chosen`, the policy's own pick over
    `candidates`. A prefix that is not hot keeps `chosen`. A hot one's request goes to the
    policy's pick over `candidates` with each home counted as caching the whole prompt and
    each other worker as prefilling `new_home_prefill` of what it lacks (none once the
    prefix has `max_homes`); a non-home so picked becomes a home. Where no candidate is
    left that way, `chosen` stands: the rule never makes a request unroutable."""
    homes = hot.arrived(key, now, chosen)
    if not homes:
        return chosen
    members = set(homes)
    room = len(homes) < hot.config.max_homes
    share = hot.config.new_home_prefill

    def view(c: Candidate) -> Candidate:
        if c.worker_id in members:
            return c._replace(cached_tokens=prompt_tokens, host_cached_tokens=0)
        if not room:
            return c._replace(healthy=False)
        missing = max(prompt_tokens - c.cached_tokens - c.host_cached_tokens, 0)
        return c._replace(cached_tokens=c.cached_tokens + missing - round(share * missing))

    try:
        wid = policy.choose(prompt_tokens, [view(c) for c in candidates])
    except Unavailable:
        return chosen
    if wid not in members:
        hot.add_home(key, wid)
    return wid

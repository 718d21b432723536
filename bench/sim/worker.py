"""A simulated worker: its cache as a block LRU (and a host-memory tier below it), its queue,
continuous batching, its events."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

from bench.sim.config import Request, SimConfig


class BlockCache:
    """A worker's radix cache at block granularity: LRU over chained block hashes.

    Every access touches a path leaf-first, so a block is always more recent than its
    descendants and the LRU order evicts leaves before their parents (as a radix tree
    does). Pinned blocks (held by running requests) are never evicted.
    """

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.blocks: OrderedDict[int, int] = OrderedDict()  # hash -> pins; LRU first
        # Blocks with no pin: whether a path fits is asked at every admission, and counting
        # them over a full cache was most of a large simulation's time.
        self.unpinned = 0

    def __len__(self) -> int:
        return len(self.blocks)

    def match(self, hashes: Sequence[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            n += 1
        return n

    def insert(self, hashes: Sequence[int], pin: bool) -> tuple[list[int], list[int]] | None:
        """Cache (and touch) a path; (stored, evicted) hashes, or None (and no change) when
        it cannot fit because too much is pinned."""
        blocks = self.blocks
        m = self.match(hashes)
        new = hashes[m:]
        keep = set(hashes[:m])
        need = len(blocks) + len(new) - self.capacity
        if need > 0:
            evictable = self.unpinned - sum(1 for h in hashes[:m] if not blocks[h])
            if evictable < need:
                return None
        evicted = self._evict(need, keep)
        for h in new:
            blocks[h] = 0
        self.unpinned += len(new)
        for h in reversed(hashes):
            blocks.move_to_end(h)
            if pin:
                if not blocks[h]:
                    self.unpinned -= 1
                blocks[h] += 1
        return list(new), evicted

    def unpin(self, hashes: Sequence[int]) -> None:
        blocks = self.blocks
        for h in hashes:
            blocks[h] -= 1
            if not blocks[h]:
                self.unpinned += 1

    def _evict(self, n: int, keep: set[int]) -> list[int]:
        """Drop up to `n` unpinned blocks, least recently used first, none of `keep`."""
        if n <= 0:
            return []
        victims = []
        for h, pins in self.blocks.items():
            if pins == 0 and h not in keep:
                victims.append(h)
                if len(victims) == n:
                    break
        for h in victims:
            del self.blocks[h]
        self.unpinned -= len(victims)
        return victims


class HostTier:
    """A worker's host-memory KV tier at block granularity: the blocks the device's cache
    evicted, LRU, exclusive of the device (a block reloaded to the device leaves it).

    The device evicts leaves first, so a path's blocks arrive here deepest first and leave
    (evicted in turn) deepest first: what is here hangs below the device's blocks, as the
    worker's events promise.
    """

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.blocks: OrderedDict[int, None] = OrderedDict()  # LRU first

    def __len__(self) -> int:
        return len(self.blocks)

    def match(self, hashes: Sequence[int], start: int) -> int:
        """How many of `hashes` from `start` on are here, in a run."""
        n = 0
        for h in hashes[start:]:
            if h not in self.blocks:
                break
            n += 1
        return n

    def take(self, hashes: Sequence[int]) -> None:
        """These blocks were reloaded to the device."""
        for h in hashes:
            del self.blocks[h]

    def put(self, hashes: Sequence[int]) -> list[int]:
        """Keep blocks the device evicted; the blocks dropped for room (LRU first)."""
        for h in hashes:
            self.blocks[h] = None
        dropped = []
        while len(self.blocks) > self.capacity:
            dropped.append(self.blocks.popitem(last=False)[0])
        return dropped


@dataclass
class Running:
    req: Request
    pinned: list[int]  # the prompt blocks this request pins ([] when it ran uncached)
    generated: int = 0


@dataclass
class Outcome:
    worker: int = -1
    cached_tokens: int = 0
    host_cached_tokens: int = 0  # reloaded from the worker's host-memory tier
    first_token: float = 0.0
    finish: float = 0.0
    arrival: float = 0.0


class SimWorker:
    def __init__(self, index: int, config: SimConfig) -> None:
        self.index = index
        self.wid = f"worker-{index}"
        self.cost = config.cost
        self.block_size = config.block_size
        self.cache = BlockCache(config.capacity_blocks)
        self.host = HostTier(config.host_capacity_blocks)
        self.waiting: deque[Request] = deque()
        self.running: list[Running] = []
        self.prefilling: list[Running] = []  # admitted in the step under way
        self.busy = False
        # The prompt blocks of the waiting requests: cached by the time a new request runs.
        self.pending: dict[int, int] = {}  # hash -> waiting requests holding it

    @property
    def queued(self) -> int:
        return len(self.running) + len(self.prefilling) + len(self.waiting)

    def will_reload(self, hashes: Sequence[int], start: int) -> int:
        """Blocks of `hashes` from `start` on that the host-memory tier holds, in a run."""
        return self.host.match(hashes, start) if self.host.capacity else 0

    def will_cache(self, hashes: Sequence[int]) -> int:
        """Leading blocks the worker holds or will hold once its waiting requests run."""
        n = 0
        for h in hashes:
            if h not in self.cache.blocks and h not in self.pending:
                break
            n += 1
        return n

    def enqueue(self, req: Request) -> None:
        self.waiting.append(req)
        for h in req.prompt_hashes:
            self.pending[h] = self.pending.get(h, 0) + 1

    def start_step(self, outcomes: list[Outcome], events: list[tuple[str, list[int]]]) -> float:
        """Admit what fits, return the step's duration (0: nothing to do)."""
        budget = self.cost.max_prefill_tokens
        new_tokens = reload_tokens = 0
        while self.waiting and len(self.running) + len(self.prefilling) < self.cost.max_batch:
            req = self.waiting[0]
            matched = self.cache.match(req.prompt_hashes)
            reloaded = self.will_reload(req.prompt_hashes, matched)
            uncached = req.prompt_len - (matched + reloaded) * self.block_size
            if self.prefilling and new_tokens + uncached > budget:
                break
            fits = self._insert(req.prompt_hashes, True, reloaded, events)
            if not fits and (self.running or self.prefilling):
                break  # the KV cache is full of running requests' blocks: wait for them
            self.waiting.popleft()
            for h in req.prompt_hashes:
                if self.pending[h] == 1:
                    del self.pending[h]
                else:
                    self.pending[h] -= 1
            outcomes[req.rid].cached_tokens = matched * self.block_size
            outcomes[req.rid].host_cached_tokens = reloaded * self.block_size
            outcomes[req.rid].worker = self.index
            self.prefilling.append(Running(req, req.prompt_hashes if fits else []))
            new_tokens += uncached
            reload_tokens += reloaded * self.block_size
        if not self.running and not self.prefilling:
            return 0.0
        c = self.cost
        step = c.step_s + c.prefill_token_s * new_tokens + c.decode_seq_s * len(self.running)
        return step + c.reload_token_s * reload_tokens if reload_tokens else step

    def _insert(
        self, hashes: Sequence[int], pin: bool, reloaded: int, events: list[tuple[str, list[int]]]
    ) -> bool:
        """Cache a path whose first `reloaded` blocks after those on the device are in host
        memory; whether it fit. Its events: the blocks the device evicted
        ("offloaded" to host memory, or "removed" without a host tier; then those the host
        tier dropped for room: "removed"), the reloaded ones ("loaded"), the new ones
        ("stored")."""
        result = self.cache.insert(hashes, pin=pin)
        if result is None:
            return False
        new, evicted = result
        loaded, stored = new[:reloaded], new[reloaded:]
        if loaded:
            self.host.take(loaded)
        if evicted:
            if self.host.capacity:
                events.append(("offloaded", evicted))
                dropped = self.host.put(evicted)
                if dropped:
                    events.append(("removed", dropped))
            else:
                events.append(("removed", evicted))
        if loaded:
            events.append(("loaded", loaded))
        if stored:
            events.append(("stored", stored))
        return True

    def end_step(
        self, now: float, outcomes: list[Outcome], events: list[tuple[str, list[int]]]
    ) -> list[Request]:
        """Emit one token per running request; the finished ones."""
        for r in self.prefilling:
            outcomes[r.req.rid].first_token = now
        self.running.extend(self.prefilling)
        self.prefilling = []
        finished, still = [], []
        for r in self.running:
            r.generated += 1
            if r.generated < r.req.output_len:
                still.append(r)
                continue
            self.cache.unpin(r.pinned)
            full = r.req.full_hashes
            reloaded = self.will_reload(full, self.cache.match(full)) if self.host.capacity else 0
            self._insert(full, False, reloaded, events)
            outcomes[r.req.rid].finish = now
            finished.append(r.req)
        self.running = still
        return finished

"""The host-memory tier under the radix tree: a pool of pinned host slots and the copies.

The radix tree decides what lives where (radix_cache.py: a node's KV is on the device,
in host memory, or both); this holds the host side of it: the host pool
(host_pool.py), its slot allocator (a `KVAllocator` over host slots, the device pool's
page size, slot 0 reserved) and the copies (host_copy.py), with counters of what they
moved.

On CUDA, copies out of the device at eviction run on the current stream, between the
forwards: a node's device slots are copied out before the forward that reuses them writes
there. Write-throughs (a new node copied out at once, `write_async`) and reloads run on a
stream of their own, after what the current stream has queued (the
slots they fill may have been freed by it), beside the forwards that follow: `load`
returns an event, and nothing reads the slots before it is done (the tree keeps the
nodes locked and out of matches until then, radix_cache.py). A reload of a long
history takes milliseconds over PCIe; on the forwards' stream every decode step queued
behind it would wait that long. The copies' GPU time is measured with CUDA events, read
back once they are done. On the CPU every copy is done when the call returns.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass

import torch

from radixmesh.worker.forward_batch import to_device
from radixmesh.worker.kvcache.allocator import KVAllocator
from radixmesh.worker.kvcache.host_copy import LOAD_PROGRAMS, copy_kv
from radixmesh.worker.kvcache.host_pool import HostKVPool
from radixmesh.worker.kvcache.pool import KVPool


@dataclass(frozen=True)
class HostTierStats:
    slots_total: int  # usable host slots
    slots_used: int
    tokens_written: int  # device -> host
    tokens_loaded: int  # host -> device
    bytes_written: int
    bytes_loaded: int
    write_seconds: float  # GPU time of the copies measured so far (CUDA; 0 on CPU)
    load_seconds: float
    bytes_timed_written: int  # the bytes those seconds moved
    bytes_timed_loaded: int

    @property
    def load_bandwidth(self) -> float:
        """Bytes a second of the timed host-to-device copies (0 before any)."""
        return self.bytes_timed_loaded / self.load_seconds if self.load_seconds else 0.0

    @property
    def write_bandwidth(self) -> float:
        return self.bytes_timed_written / self.write_seconds if self.write_seconds else 0.0


class HostTier:
    def __init__(self, pool: KVPool, num_slots: int, page_size: int) -> None:
        self.pool = pool
        self.host = HostKVPool(pool, num_slots, pin=pool.device.type == "cuda")
        self.allocator = KVAllocator(num_slots, page_size)
        self.bytes_per_token = HostKVPool.bytes_per_slot(pool)
        self._timed = pool.device.type == "cuda"
        self.stream = torch.cuda.Stream(pool.device) if self._timed else None
        self._pending: deque[tuple[torch.cuda.Event, torch.cuda.Event, int, bool]] = deque()
        self._tokens = [0, 0]  # written, loaded
        self._seconds = [0.0, 0.0]
        self._timed_bytes = [0, 0]

    @staticmethod
    def slots_for_bytes(pool: KVPool, num_bytes: int, page_size: int) -> int:
        """Host slots (a whole number of pages, the reserved one included) in num_bytes."""
        slots = num_bytes // HostKVPool.bytes_per_slot(pool)
        return slots - slots % page_size

    def alloc(self, n: int) -> torch.Tensor | None:
        """n host slots, or None when the host pool lacks them (the tree evicts and retries)."""
        return self.allocator.alloc(n, on_host=True)

    def free(self, slots: torch.Tensor) -> None:
        self.allocator.free(slots)

    def write(self, device_slots: torch.Tensor, host_slots: torch.Tensor) -> None:
        """Copy the KV of device slots into host slots (stream-ordered on CUDA)."""
        self._copy(device_slots, host_slots, to_host=True)

    def load(self, host_slots: torch.Tensor, device_slots: torch.Tensor) -> torch.cuda.Event | None:
        """Copy the KV of host slots into device slots: on CUDA on the tier's stream,
        returning the event that marks it done (None: done already, on the CPU)."""
        return self._beside(device_slots, host_slots, to_host=False)

    def write_async(
        self, device_slots: torch.Tensor, host_slots: torch.Tensor
    ) -> torch.cuda.Event | None:
        """Copy the KV of device slots into host slots beside the forwards (write-through):
        on CUDA on the tier's stream, after what the current stream has queued (the KV may
        be a forward's still in flight), returning the event that marks it done (None:
        done already, on the CPU). Slots freed while it runs must not be written before
        it is done (`order_after`)."""
        return self._beside(device_slots, host_slots, to_host=True)

    def _beside(
        self, device_slots: torch.Tensor, host_slots: torch.Tensor, to_host: bool
    ) -> torch.cuda.Event | None:
        """A copy on the tier's stream, after what the current stream has queued (the
        slots may be a forward's, or freed by one), with LOAD_PROGRAMS programs; the
        event that ends it (None on the CPU, where it is done on return)."""
        if self.stream is None:
            self._copy(device_slots, host_slots, to_host=to_host)
            return None
        dev = to_device(device_slots, self.pool.device)
        hs = to_device(host_slots, self.pool.device)
        self.stream.wait_stream(torch.cuda.current_stream(self.pool.device))
        with torch.cuda.stream(self.stream):
            self._copy(dev, hs, to_host=to_host, programs=LOAD_PROGRAMS)
            done = torch.cuda.Event()
            done.record()
        dev.record_stream(self.stream)  # made on the current stream, read on this one
        hs.record_stream(self.stream)
        return done

    def order_after(self, done: torch.cuda.Event) -> None:
        """Make the current stream's later work wait for `done` (on the GPU, not here)."""
        torch.cuda.current_stream(self.pool.device).wait_event(done)

    def finished(self, done: torch.cuda.Event, wait: bool = False) -> bool:
        """Whether a reload `load` returned is done (waiting for it with `wait`); once it
        is, the current stream is ordered after it, so the forwards see its writes."""
        if not wait and not done.query():
            return False
        torch.cuda.current_stream(self.pool.device).wait_event(done)
        return True

    def _copy(
        self,
        device_slots: torch.Tensor,
        host_slots: torch.Tensor,
        to_host: bool,
        programs: int | None = None,
    ) -> None:
        """`programs`: the copy kernel's (None: one per row out, LOAD_PROGRAMS back in)."""
        i = 0 if to_host else 1
        n = device_slots.numel()
        self._tokens[i] += n
        if programs is None:
            programs = 0 if to_host else LOAD_PROGRAMS
        if not self._timed:
            copy_kv(self.pool, self.host, device_slots, host_slots, to_host=to_host)
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        copy_kv(self.pool, self.host, device_slots, host_slots, to_host=to_host, programs=programs)
        end.record()
        self._pending.append((start, end, n * self.bytes_per_token, to_host))
        self._harvest()

    def _harvest(self) -> None:
        """Fold the timings of finished copies into the totals (never waits)."""
        while self._pending and self._pending[0][1].query():
            start, end, nbytes, to_host = self._pending.popleft()
            i = 0 if to_host else 1
            self._seconds[i] += start.elapsed_time(end) / 1000.0
            self._timed_bytes[i] += nbytes

    def stats(self) -> HostTierStats:
        if self._timed:
            self._harvest()
        a = self.allocator
        per = self.bytes_per_token
        return HostTierStats(
            slots_total=a.num_usable_slots,
            slots_used=a.num_usable_slots - a.num_free_slots,
            tokens_written=self._tokens[0],
            tokens_loaded=self._tokens[1],
            bytes_written=self._tokens[0] * per,
            bytes_loaded=self._tokens[1] * per,
            write_seconds=self._seconds[0],
            load_seconds=self._seconds[1],
            bytes_timed_written=self._timed_bytes[0],
            bytes_timed_loaded=self._timed_bytes[1],
        )


def default_host_bytes(
    pool_bytes: int, gpu_memory_share: float, ram_fraction: float, pool_multiple: int
) -> int:
    """The host tier's size when none is given (CacheConfig.host_kv_cache_bytes): a share
    of the host's memory per GPU on it, at most half of what is available now and a
    multiple of the device pool. The GPUs are counted from the driver's list, which sees
    every GPU on the host whatever CUDA_VISIBLE_DEVICES hides from this process."""
    total, available = _meminfo()
    per_gpu = total * ram_fraction * gpu_memory_share / max(1, _gpus_on_host())
    return int(min(per_gpu, available / 2, pool_bytes * pool_multiple))


def _meminfo() -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes, from /proc/meminfo (0, 0 where there is none)."""
    fields: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                fields[name] = int(rest.split()[0]) * 1024
    except OSError:
        return 0, 0
    return fields.get("MemTotal", 0), fields.get("MemAvailable", 0)


def _gpus_on_host() -> int:
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return torch.cuda.device_count() if torch.cuda.is_available() else 1

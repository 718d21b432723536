"""Rank 0's side of a TP group: spawn ranks 1..N-1, feed them steps, watch them, stop them.

Failure handling: a watchdog thread waits on the followers' process sentinels; when one
exits unasked it reports once through `on_failure` (the engine then fails every waiter
with Unavailable and the server exits non-zero). A collective that fails (gloo raises
when a peer's socket closes) or a pipe that breaks raises `RankFailure` in the step.
Followers leave on their own when rank 0 is gone (pipe end-of-file, a parent-pid check,
the collective timeout), so no rank is left waiting.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import torch
import torch.distributed as dist

from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.worker.batch import Batch
from radixmesh.worker.config import EngineConfig
from radixmesh.worker.forward_batch import ForwardBatch
from radixmesh.worker.model.loader import load_arch_config
from radixmesh.worker.tp.group import (
    backend_for,
    check_tp_size,
    destroy_group,
    init_group,
    make_store,
)
from radixmesh.worker.tp.step import STOP, StepHeader, send_tables

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0  # a follower that has not exited this long after STOP is killed


FollowerMain = Callable[[EngineConfig, int, int, Connection, int], None]


class RankFailure(Unavailable):
    """A tensor-parallel rank died or a collective failed: the worker cannot go on."""


class FollowerRanks:
    """Ranks 1..N-1 of this worker's TP group, as child processes.

    Construction spawns them and joins the process group (blocking until every rank
    has joined); `tp` is then rank 0's TPGroup for the layers. Call `wait_ready()` once
    rank 0's own model is up, `send_step()` before every forward, `stop()` at the end.
    """

    def __init__(self, config: EngineConfig, device: torch.device, entry: FollowerMain) -> None:
        """`entry` is the follower processes' entry point (worker.py's `follower_main`):
        called as entry(config, rank, store port, pipe end, rank 0's pid)."""
        if dist.is_initialized():  # before spawning anything
            raise InvalidArgument(
                "tp_size",
                "this process already holds a tensor-parallel group (one TP engine per "
                "process; on CPU shut the other one down first, on CUDA the group lasts "
                "as long as the process)",
            )
        pc = config.parallel
        check_tp_size(load_arch_config(config.model.model), pc.tp_size)
        self.size = pc.tp_size
        self._joined = False  # whether this object initialized the process group
        self.timeout_s = pc.tp_timeout
        self.backend = backend_for(device)
        self.failure: str | None = None
        self._on_failure: Callable[[str], None] | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        store = make_store(0, self.size, 0, self.timeout_s)
        self._store = store  # rank 0 serves the rendezvous store: keep it alive
        ctx = mp.get_context("spawn")  # fork would copy the scheduler's threads and CUDA
        self.procs: list[BaseProcess] = []
        self.conns: list[Connection] = []
        for rank in range(1, self.size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=entry,
                args=(config, rank, store.port, child_end, os.getpid()),
                name=f"radixmesh-tp-rank{rank}",
                daemon=True,
            )
            proc.start()
            child_end.close()
            logger.info("tensor-parallel rank %d/%d: pid %s", rank, self.size, proc.pid)
            self.procs.append(proc)
            self.conns.append(parent_end)
        self._watchdog = threading.Thread(target=self._watch, name="radixmesh-tp-watchdog")
        self._watchdog.daemon = True
        self._watchdog.start()
        try:
            self._expect("hello")  # each follower started; only then block in the rendezvous
            self.tp = init_group(
                rank=0, size=self.size, store=store, device=device, timeout_s=self.timeout_s
            )
            self._joined = True
        except BaseException:
            self.stop()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def wait_ready(self) -> None:
        """Block until every follower built its model shard, KV pool and graphs."""
        self._expect("ready")

    def watch(self, on_failure: Callable[[str], None]) -> None:
        """Call on_failure(message) once, from the watchdog thread, if a follower dies."""
        with self._lock:
            self._on_failure = on_failure
            failure = self.failure
        if failure is not None:
            on_failure(failure)

    def send_step(
        self, batch: Batch, fb: ForwardBatch, logit_rows: list[int], ids_on_device: bool = False
    ) -> None:
        """Describe this step to every follower; they run the forward with rank 0.
        `ids_on_device`: fb.input_ids hold tokens the host has not seen (overlap.py)."""
        if self.failure is not None:
            raise RankFailure(self.failure)
        header = StepHeader.of(batch, fb, logit_rows, ids_on_device)
        data = header.encode()
        try:
            for conn in self.conns:
                conn.send_bytes(data)
        except OSError as e:  # BrokenPipeError: a follower is gone
            raise RankFailure(self.failure or f"a tensor-parallel rank is gone: {e}") from e
        send_tables(self.tp, header, fb.out_cache_loc, fb.req_rows, fb.req_to_token, fb.input_ids)

    def stop(self) -> None:
        """Tell every follower to exit, wait (then kill), and leave the process group."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(STOP)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                logger.warning("tensor-parallel rank %s did not stop: killing it", proc.name)
                proc.kill()
                proc.join(timeout=5.0)
        for conn in self.conns:
            conn.close()
        # NCCL: never destroy. Seen on two H200s (2026-11-30): a follower hung in
        # destroy_process_group after STOP, and rank 0's own destroy then hung with the peer
        # killed; the process exits soon after anyway (one TP engine per process). gloo
        # tears down locally, which lets CPU tests build several TP engines in a row.
        if self._joined and self.backend == "gloo":
            destroy_group()

    # ---- internals ----------------------------------------------------------------

    def _expect(self, what: str) -> None:
        """Wait for message `what` from every follower, failing fast if one dies."""
        deadline = time.monotonic() + self.timeout_s
        for rank, (conn, proc) in enumerate(zip(self.conns, self.procs, strict=True), 1):
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RankFailure(f"tensor-parallel rank {rank}: no {what!r} in time")
                ready = wait([conn, proc.sentinel], timeout=left)
                if conn in ready:
                    msg = _recv(conn)
                    if msg is None:
                        raise RankFailure(self._exit_message(rank, proc, f"before {what!r}"))
                    if msg[0] == "error":
                        raise RankFailure(f"tensor-parallel rank {rank} failed: {msg[1]}")
                    if msg[0] == what:
                        break
                elif ready:  # only the sentinel: exited without a word
                    proc.join(timeout=1.0)
                    raise RankFailure(self._exit_message(rank, proc, f"before {what!r}"))

    def _watch(self) -> None:
        sentinels = {p.sentinel: (rank, p) for rank, p in enumerate(self.procs, 1)}
        while not self._stopping.is_set():
            dead = wait(list(sentinels), timeout=0.2)
            if not dead or self._stopping.is_set():
                continue
            rank, proc = sentinels[dead[0]]  # type: ignore[index]
            proc.join(timeout=1.0)
            self._fail(self._exit_message(rank, proc, "unexpectedly"))
            return

    def _fail(self, message: str) -> None:
        logger.error("%s", message)
        with self._lock:
            if self.failure is not None:
                return
            self.failure = message
            callback = self._on_failure
        if callback is not None:
            callback(message)

    @staticmethod
    def _exit_message(rank: int, proc: BaseProcess, when: str) -> str:
        return (
            f"tensor-parallel rank {rank} (pid {proc.pid}) exited {when} with code {proc.exitcode}"
        )


def _recv(conn: Connection) -> tuple[Any, ...] | None:
    try:
        msg: tuple[Any, ...] = conn.recv()
    except (EOFError, OSError):
        return None
    return msg

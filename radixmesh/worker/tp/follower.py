"""Ranks 1..N-1: build this rank's shard of the worker, then run forwards as told.

A follower builds the same `Worker` as rank 0 (same code path, so KV pool sizing and
CUDA-graph capture run their collectives in lockstep; worker.py's `follower_main` is the
process's entry point) but only ever uses its model runner: each step it reads a
`StepHeader` from its pipe, receives the KV slot tables, runs the forward, and computes
its vocabulary shard of the logits rank 0 asked for. It exits on STOP (code 0), and with
code 1 when rank 0 is gone (end-of-file on the pipe or a new parent pid) or anything
fails, so no rank outlives its worker.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

import torch

from radixmesh.worker.config import EngineConfig
from radixmesh.worker.device import resolve_device
from radixmesh.worker.forward_batch import ForwardBatch, to_device
from radixmesh.worker.layers.parallel import TPGroup
from radixmesh.worker.model_runner import ModelRunner
from radixmesh.worker.tp.group import destroy_group, init_group, make_store, rank_device
from radixmesh.worker.tp.step import STOP, StepHeader, receive_tables

logger = logging.getLogger(__name__)

PARENT_POLL_S = 0.5


# What a follower builds before it follows: its model runner and req->token table (rank 0's
# `Worker`, built on this rank's share of the group; worker.py's `follower_main`).
Build = Callable[[TPGroup], tuple[ModelRunner, torch.Tensor]]


def run_follower(
    config: EngineConfig, rank: int, port: int, conn: Connection, parent_pid: int, build: Build
) -> None:
    """A follower process's life: join rank 0's group, build, follow, exit."""
    _exit_with_parent(parent_pid)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s tp-rank{rank} %(name)s: %(message)s"
    )
    pc = config.parallel
    try:
        device = rank_device(resolve_device(config.model.device), rank)
        if device.type == "cpu":  # share the cores with the other ranks
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // pc.tp_size))
        # Imports done: rank 0 now blocks in the rendezvous, which cannot see a death.
        conn.send(("hello",))
        store = make_store(rank, pc.tp_size, port, pc.tp_timeout)
        tp = init_group(
            rank=rank, size=pc.tp_size, store=store, device=device, timeout_s=pc.tp_timeout
        )
        runner, req_to_token = build(tp)
        if config.scheduler.gc_freeze:  # as rank 0's Engine: start-up's objects out of the
            gc.collect()  # collector, whose full walks would stall every rank's step
            gc.freeze()
        conn.send(("ready",))
    except BaseException as e:
        traceback.print_exc()
        _send_quietly(conn, ("error", f"{type(e).__name__}: {e}"))
        os._exit(1)
    try:
        follow(runner, tp, req_to_token, conn)
    except EOFError:
        logger.error("rank 0 is gone: exiting")
        os._exit(1)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    if device.type != "cuda":  # NCCL's destroy can hang at exit (see FollowerRanks.stop)
        destroy_group()
    os._exit(0)


def follow(runner: ModelRunner, tp: TPGroup, req_to_token: torch.Tensor, conn: Connection) -> None:
    """Run forwards as rank 0 sends them, until STOP. Raises EOFError when rank 0 is gone."""
    while True:
        data = conn.recv_bytes()
        if data == STOP:
            return
        header = StepHeader.decode(data)
        out_cache_loc, input_ids = receive_tables(tp, header, req_to_token)
        batch = ForwardBatch.build(
            input_ids=header.input_ids,
            out_cache_loc=out_cache_loc,
            req_rows=header.req_rows,
            prefix_lens=header.prefix_lens,
            extend_lens=header.extend_lens,
            req_to_token=req_to_token,
        )
        if input_ids is not None:  # overlap: rank 0's resolved ids, not the placeholders
            batch.input_ids = input_ids
        with torch.inference_mode():
            _forward(runner, batch, header.logit_rows)


def _forward(runner: ModelRunner, batch: ForwardBatch, logit_rows: list[int]) -> None:
    """This rank's part of ModelRunner.forward: the model, then its share of the logits
    (the LM head's all-gather needs every rank; rank 0 alone samples)."""
    if runner.decode_graphs is not None and runner.decode_graphs.can_run(batch):
        hidden = runner.decode_graphs.run(batch)  # [B, hidden]
    else:
        runner.attn.prepare(batch)
        hidden = runner.model(batch, runner.attn)  # [T, hidden]
    if logit_rows:
        index = to_device(torch.tensor(logit_rows, dtype=torch.int64), hidden.device)
        runner.model.compute_logits(hidden.index_select(0, index))


def _exit_with_parent(parent_pid: int) -> None:
    """Exit when rank 0's process is gone (re-parented), even mid-collective."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="radixmesh-tp-parent-watch", daemon=True).start()


def _send_quietly(conn: Connection, msg: tuple[str, ...]) -> None:
    with contextlib.suppress(OSError):
        conn.send(msg)

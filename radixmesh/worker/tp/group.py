"""Joining the process group: gloo on CPU, NCCL on CUDA (rank r on cuda:base+r)."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from radixmesh.errors import InvalidArgument
from radixmesh.worker.layers.parallel import TPGroup
from radixmesh.worker.model.arch import LlamaArchConfig

HOST = "127.0.0.1"  # the ranks of one worker share a host


def rank_device(base: torch.device, rank: int) -> torch.device:
    """Rank r's device: cuda:(base index + r) on CUDA, the CPU otherwise."""
    if base.type != "cuda":
        return base
    return torch.device("cuda", (base.index or 0) + rank)


def check_tp_size(arch: LlamaArchConfig, size: int) -> None:
    """InvalidArgument on tp_size when the model cannot be split `size` ways."""
    heads, kv, inter = arch.num_attention_heads, arch.num_key_value_heads, arch.intermediate_size
    if heads % size:
        raise InvalidArgument(
            "tp_size", f"the model's {heads} attention heads do not split {size} ways"
        )
    if (kv % size) if kv >= size else (size % kv):
        raise InvalidArgument(
            "tp_size", f"the model's {kv} KV heads neither split {size} ways nor replicate evenly"
        )
    if inter % size:
        raise InvalidArgument(
            "tp_size", f"the model's intermediate size {inter} does not split {size} ways"
        )
    if arch.num_experts and arch.expert_size % size:
        raise InvalidArgument(
            "tp_size",
            f"the model's expert intermediate size {arch.expert_size} does not split {size} ways",
        )


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def make_store(rank: int, size: int, port: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0 listens (port 0: any free port, read back from `store.port`); others connect."""
    return dist.TCPStore(
        HOST,
        port,
        size,
        is_master=rank == 0,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def init_group(
    *, rank: int, size: int, store: dist.Store, device: torch.device, timeout_s: float
) -> TPGroup:
    """Join the default process group of this worker's TP ranks; returns the layers' view.

    A process holds at most one TP group: the default group is process-wide.
    """
    if dist.is_initialized():
        raise RuntimeError(
            "tp_size: this process already holds a tensor-parallel group "
            "(one TP engine per process; shut the other one down first)"
        )
    # NVLink multicast (NVLS) stays off on the test machines; set before NCCL starts.
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend_for(device),
        store=store,
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=timeout_s),
        # CUDA: NCCL starts now, not at the first collective, which may be graph-captured.
        device_id=device if device.type == "cuda" else None,
    )
    return TPGroup(rank=rank, size=size)


def destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_if_group_alive(code: int) -> None:
    """End the process now (status `code`) when it still holds a process group.

    An NCCL group is never destroyed (see FollowerRanks.stop), and interpreter teardown
    may block on it; a CLI command that is done anyway leaves with os._exit instead.
    A no-op without a group (tp 1, or gloo after shutdown)."""
    if dist.is_available() and dist.is_initialized():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

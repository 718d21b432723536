"""Decode attention's stage 1 over an FP8 pool in CUDA C++ (cuda/decode_fp8.cu says how
and why), built with nvcc at first use and loaded through ctypes (worker/cuda_library.py:
the cache, ahead-of-time builds); the worker builds it before it reports ready
(`prepare_library`), in ~3 s.

Where it does not apply (no CUDA, a GPU before sm_89, which lacks the e4m3 -> f16
conversion instruction, no nvcc, a head dim other than 128, more than 8 query heads per
KV head, float32 queries) decode_attention.py takes the Triton kernels, and the reason is
logged once. `RADIXMESH_FP8_DECODE=triton` chooses the Triton kernels on purpose (A/B);
`RADIXMESH_FP8_DECODE=cuda:W,K,S,B` a launch of LAUNCHES other than the default.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from pathlib import Path

import torch

from radixmesh.worker import cuda_library

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "cuda" / "decode_fp8.cu"
SWITCH = "RADIXMESH_FP8_DECODE"  # "triton", "cuda" (the default) or "cuda:W,K,S,B"
HEAD_DIM = 128
MAX_GROUP = 8  # query heads per KV head: the mma tile's 8 live rows
# The launches cuda/decode_fp8.cu compiles, as (warps per block, keys a warp loads at a
# time, stages, blocks an SM is compiled to hold: 0 for no register cap); tiles go
# straight into registers, 16 keys at a time (one stage). The first is the default (the
# decode sweep's fastest on the H200, docs/performance.md).
LAUNCHES = ((2, 16, 1, 8), (4, 16, 1, 0))


class _Params(ctypes.Structure):
    """cuda/decode_fp8.cu's `Params`, field for field."""

    _fields_ = [
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("k_exp", ctypes.c_void_p),
        ("v_exp", ctypes.c_void_p),
        ("mid_o", ctypes.c_void_p),
        ("mid_l", ctypes.c_void_p),
        ("req_to_token", ctypes.c_void_p),
        ("req_rows", ctypes.c_void_p),
        ("seq_lens", ctypes.c_void_p),
        ("scale_log2", ctypes.c_float),
        ("num_splits", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32),
        ("group", ctypes.c_int32),
        ("q_bf16", ctypes.c_int32),
        ("pad", ctypes.c_int32),
        ("stride_qt", ctypes.c_int64),
        ("stride_qh", ctypes.c_int64),
        ("stride_buf_slot", ctypes.c_int64),
        ("stride_buf_head", ctypes.c_int64),
        ("stride_scale_slot", ctypes.c_int64),
        ("stride_table", ctypes.c_int64),
        ("stride_mid_b", ctypes.c_int64),
        ("stride_mid_h", ctypes.c_int64),
        ("stride_mid_s", ctypes.c_int64),
    ]


def launch_override() -> tuple[int, int, int, int] | None:
    """The launch `RADIXMESH_FP8_DECODE=cuda:W,K,S,B` names (one of LAUNCHES), if any."""
    value = os.environ.get(SWITCH, "cuda")
    if not value.startswith("cuda:"):
        return None
    launch = tuple(int(x) for x in value.removeprefix("cuda:").split(","))
    if launch not in LAUNCHES:
        raise ValueError(f"{SWITCH}: {value!r} is not one of {LAUNCHES}")
    return launch  # type: ignore[return-value,unused-ignore]


@functools.cache
def library(device_index: int) -> ctypes.CDLL | None:
    """The built library for this GPU, or None (the reason logged once)."""
    lib = cuda_library.load(SOURCE, device_index, "FP8 decode")
    if lib is None:
        return None
    lib.radixmesh_decode_fp8_split.restype = ctypes.c_int
    lib.radixmesh_decode_fp8_split.argtypes = [
        ctypes.POINTER(_Params), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64,
    ]  # fmt: skip
    size, here = lib.radixmesh_decode_fp8_params_size(), ctypes.sizeof(_Params)
    if size != here:  # the two definitions disagree
        log.warning("FP8 decode: parameter block %d bytes in CUDA, %d here", size, here)
        return None
    return lib


def shapes_fit(q: torch.Tensor, k_buf: torch.Tensor) -> bool:
    """Whether the kernel's shapes and 16-byte loads fit: 16-bit queries, an e4m3 pool,
    head dim 128, at most MAX_GROUP query heads per KV head, and query rows and pool
    slots aligned to 16 bytes (a query that is a view into a fused projection's output
    keeps its rows' alignment; anything else takes the Triton kernels)."""
    if q.dtype not in (torch.bfloat16, torch.float16) or k_buf.dtype != torch.float8_e4m3fn:
        return False
    hq, hkv = q.shape[1], k_buf.shape[1]
    if q.shape[2] != HEAD_DIM or hq % hkv or hq // hkv > MAX_GROUP:
        return False
    return (
        q.stride(2) == 1
        and q.data_ptr() % 16 == 0
        and q.stride(0) % 8 == 0
        and q.stride(1) % 8 == 0
        and k_buf.stride(2) == 1
        and k_buf.stride(1) % 16 == 0
        and k_buf.stride(0) % 16 == 0
        and k_buf.data_ptr() % 16 == 0
    )


def applies(q: torch.Tensor, k_buf: torch.Tensor) -> bool:
    """Whether the CUDA kernel serves this query and FP8 pool (its library built)."""
    if os.environ.get(SWITCH, "cuda") == "triton" or not q.is_cuda:
        return False
    return shapes_fit(q, k_buf) and library(q.device.index or 0) is not None


def prepare_library(device: torch.device) -> bool:
    """Build (or load) the library before the first decode step: the worker's start."""
    return device.type == "cuda" and library(device.index or 0) is not None


def decode_split_fp8_cuda(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor],
    workspace: tuple[torch.Tensor, torch.Tensor],
    req_to_token: torch.Tensor,
    req_rows: torch.Tensor,
    seq_lens: torch.Tensor,
    scale_log2: float,
    num_splits: int,
    num_warps: int,
    min_blocks: int,
) -> None:
    """Stage 1 of `decode_attention` over an FP8 pool, as decode_split_fp8_mma: each
    (sequence, KV head, split)'s partial output and log-sum-exp into `workspace`."""
    lib = library(q.device.index or 0)
    assert lib is not None, "decode_split_fp8_cuda without its library (see applies)"
    b, hq, d = q.shape
    hkv = k_buf.shape[1]
    k_exp, v_exp = scales
    mid_o, mid_l = workspace
    # 16-byte loads: the query rows, each slot's head and the buffers themselves aligned.
    assert shapes_fit(q, k_buf) and k_buf.stride() == v_buf.stride()
    assert v_buf.data_ptr() % 16 == 0
    assert k_exp.stride() == v_exp.stride() and k_exp.stride(1) == 1
    assert req_to_token.dtype == req_rows.dtype == seq_lens.dtype == torch.int64
    assert mid_o.stride(2) == d and mid_l.stride(1) == mid_o.stride(1) // d
    params = _Params(
        q.data_ptr(), k_buf.data_ptr(), v_buf.data_ptr(), k_exp.data_ptr(), v_exp.data_ptr(),
        mid_o.data_ptr(), mid_l.data_ptr(), req_to_token.data_ptr(), req_rows.data_ptr(),
        seq_lens.data_ptr(), scale_log2, num_splits, hkv, hq // hkv,
        int(q.dtype == torch.bfloat16), 0, q.stride(0), q.stride(1), k_buf.stride(0),
        k_buf.stride(1), k_exp.stride(0), req_to_token.stride(0), mid_o.stride(0),
        mid_o.stride(1), mid_o.stride(2),
    )  # fmt: skip
    stream = torch.cuda.current_stream(q.device).cuda_stream
    err = lib.radixmesh_decode_fp8_split(ctypes.byref(params), b, num_warps, min_blocks, stream)
    if err != 0:
        raise RuntimeError(f"FP8 decode kernel launch failed: cudaError {err}")


def main(argv: list[str] | None = None) -> None:
    """`python -m radixmesh.worker.attention.kernels.decode_fp8_cuda 8.9 9.0 10.0`: build the
    library for these GPU architectures into RADIXMESH_CUDA_CACHE ahead of time (the CUDA
    image does, so its workers start without compiling)."""
    cuda_library.build_ahead(SOURCE, argv, main.__doc__)


if __name__ == "__main__":
    main()

"""The decode-time FP8 GEMM (1-16 rows) in CUDA C++ (cuda/fp8_gemv.cu says how and why),
built with nvcc at first use and loaded through ctypes (worker/cuda_library.py).

The kernel table measured at load (quantization/fp8_gemm_choice.py) takes it where it
times faster than the other small-batch kernels; `RADIXMESH_FP8_SMALL_M=cuda` takes it
wherever it applies (CUDA sm_89+, nvcc found or a library already built, 16-bit
activations, 1-16 rows, per-channel weight scales, output channels a multiple of 16,
input columns a multiple of 128, 16-byte aligned weight and activation rows); anything
else keeps the Triton kernel. `python -m bench.fp8_gemm --cuda-gemv` times it
beside the Triton kernel and bf16 (docs/quantization.md).
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch

from radixmesh.worker import cuda_library

SOURCE = Path(__file__).parent / "cuda" / "fp8_gemv.cu"
SWITCH = "RADIXMESH_FP8_SMALL_M"  # "cuda": this kernel; "0": neither; else the Triton one
MAX_ROWS = 16
CHUNK = 128  # input columns a warp's k-steps cover at once (the .cu's kChunk)
WARP_COUNTS = (1, 2, 4, 8, 16)  # warps per block the .cu compiles
# Warps in flight over the whole launch that the block size aims for (16 on each of an
# H200's 132 SMs, ~8 KB of loads each), with at least CHUNKS_PER_WARP chunks a warp (two
# of the .cu's stages of kStage = 2: one in flight while the other is multiplied) and at
# least MIN_WARPS a block. Measured on the H200 (2026-12-05, fp8_gemm-h200.json,
# `cuda_gemv_us_by_warps`, one row, a block per slab before the K loop was pipelined):
# o (256 blocks) and down (256) fastest at 8 warps (6.3 against 7.1 at 4 and 7.8 at 16;
# 20.1 against 24.4 and 21.8), qkv (384) at 4 (8.3 against 9.8 and 10.7), gate/up (1,792)
# at 4 or 8 (36.6, 37.4; 48.9 at 16).
TARGET_WARPS = 2048
CHUNKS_PER_WARP = 4
MIN_WARPS = 4


class _GemvParams(ctypes.Structure):
    """cuda/fp8_gemv.cu's `GemvParams`, field for field."""

    _fields_ = [
        ("x", ctypes.c_void_p),
        ("w", ctypes.c_void_p),
        ("scale", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("y", ctypes.c_void_p),
        ("m", ctypes.c_int32),
        ("n", ctypes.c_int32),
        ("k", ctypes.c_int32),
        ("x_bf16", ctypes.c_int32),
        ("stride_x", ctypes.c_int64),
        ("stride_w", ctypes.c_int64),
        ("stride_y", ctypes.c_int64),
    ]


@functools.cache
def library(device_index: int) -> ctypes.CDLL | None:
    """The built library for this GPU, or None (the reason logged once)."""
    lib = cuda_library.load(SOURCE, device_index, "FP8 small-batch GEMM")
    if lib is None:
        return None
    lib.radixmesh_fp8_gemv.restype = ctypes.c_int
    lib.radixmesh_fp8_gemv.argtypes = [
        ctypes.POINTER(_GemvParams),
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int64,
    ]
    if lib.radixmesh_fp8_gemv_params_size() != ctypes.sizeof(_GemvParams):
        return None  # the two definitions disagree
    return lib


def shapes_fit(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> bool:
    """16-bit activations of 1-16 rows, e4m3 weights [n, k] with n % 16 == 0, k % 128 ==
    0, unit column stride and 16-byte aligned rows, one scale per output channel."""
    if x.dtype not in (torch.bfloat16, torch.float16) or q.dtype != torch.float8_e4m3fn:
        return False
    if x.dim() != 2 or q.dim() != 2 or scale.dim() != 1:
        return False
    m, k = x.shape
    n = q.shape[0]
    return (
        1 <= m <= MAX_ROWS
        and q.shape[1] == k
        and n % 16 == 0
        and k % CHUNK == 0
        and q.stride(1) == 1
        and q.stride(0) % 16 == 0
        and q.data_ptr() % 16 == 0
        and x.stride(1) == 1
        and x.stride(0) % 8 == 0  # 16-byte loads of 16-bit activations
        and x.data_ptr() % 16 == 0
        and scale.is_contiguous()
    )


def applies(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether `RADIXMESH_FP8_SMALL_M=cuda` asks for this kernel and it serves this call."""
    if os.environ.get(SWITCH, "1") != "cuda" or not x.is_cuda:
        return False
    return shapes_fit(x, q, scale) and library(x.device.index or 0) is not None


def warps_for(n: int, k: int) -> int:
    """Warps a block for n output channels (n / 16 blocks) and k input columns: the
    largest of WARP_COUNTS within TARGET_WARPS over all blocks, but at least MIN_WARPS,
    and at most one with CHUNKS_PER_WARP chunks a warp (one warp for short rows)."""
    blocks = max(1, n // 16)
    chunks = k // CHUNK
    fits = [w for w in WARP_COUNTS if w * CHUNKS_PER_WARP <= chunks]
    if not fits:
        return 1
    wanted = [w for w in fits if w * blocks <= TARGET_WARPS or w <= MIN_WARPS]
    return wanted[-1]


def fp8_gemv_cuda(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    warps: int | None = None,
    persistent: bool = True,
) -> torch.Tensor:
    """x [m, k] (1 <= m <= 16) times e4m3 q [n, k] with float32 scales [n] (+ bias [n])
    -> [m, n] in x's dtype (`shapes_fit` must hold); `warps` a block (WARP_COUNTS, at
    most k / CHUNK) overrides `warps_for` (for bench.fp8_gemm's sweep); `persistent`: a
    grid of the blocks the SMs hold at once, each walking several slabs of 16 output
    channels, rather than a block per slab (cuda/fp8_gemv.cu says why)."""
    lib = library(x.device.index or 0)
    assert lib is not None and shapes_fit(x, q, scale), "fp8_gemv_cuda without applies()"
    m, k = x.shape
    n = q.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if bias is not None:
        bias = bias.to(x.dtype).contiguous()
    params = _GemvParams(
        x.data_ptr(), q.data_ptr(), scale.data_ptr(), bias.data_ptr() if bias is not None else None,
        y.data_ptr(), m, n, k, int(x.dtype == torch.bfloat16), x.stride(0), q.stride(0),
        y.stride(0),
    )  # fmt: skip
    stream = torch.cuda.current_stream(x.device).cuda_stream
    err = lib.radixmesh_fp8_gemv(
        ctypes.byref(params), warps or warps_for(n, k), int(persistent), stream
    )
    if err != 0:
        raise RuntimeError(f"FP8 small-batch GEMM launch failed: cudaError {err}")
    return y


def main(argv: list[str] | None = None) -> None:
    """`python -m radixmesh.worker.layers.kernels.fp8_gemv_cuda 8.9 9.0 10.0`: build the
    library for these GPU architectures into RADIXMESH_CUDA_CACHE ahead of time."""
    cuda_library.build_ahead(SOURCE, argv, main.__doc__)


if __name__ == "__main__":
    main()

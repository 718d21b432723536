"""The decode-time FP8 GEMM (1-16 rows) in CUDA C++ (cuda/fp8_gemv.cu says how and why),
built with nvcc at first use and loaded through ctypes (worker/cuda_library.py).

Opt-in until it is measured against the Triton small-batch kernel (fp8_small_m.py) on a
GPU: `RADIXMESH_FP8_SMALL_M=cuda` takes it where it applies (CUDA sm_89+, nvcc found or a
library already built, 16-bit activations, 1-16 rows, per-channel weight scales, output
channels a multiple of 16, input columns a multiple of 128, 16-byte aligned weight rows);
anything else keeps the Triton kernel. `python -m bench.fp8_gemm --cuda-gemv` times it
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
WARPS = 4  # warps per block of the products' launch (2, 4 or 8 are compiled)
# Blocks of the products' launch the K split aims for: 4 a SM of an H100 / H200 (132 SMs),
# so that enough 16-byte loads are in flight on every SM.
TARGET_BLOCKS = 4 * 132
MAX_SPLITS = 16
# Each K slice past the first writes and reads back a float32 partial sum per row and
# output channel (8 bytes a row and channel) against the k bytes of weights a channel
# reads: m rows and s slices add s * 8m / k of the weights' traffic. Slices are capped so
# that this stays within 1/8 (k / (64 m) slices): free at one row (o at 4,096 columns
# keeps its 8 slices), while 16 rows take 4 rather than 8, whose partial sums would add
# a quarter of the weights' bytes.
PARTIAL_TRAFFIC_SHARE = 8


class _GemvParams(ctypes.Structure):
    """cuda/fp8_gemv.cu's `GemvParams`, field for field."""

    _fields_ = [
        ("x", ctypes.c_void_p),
        ("w", ctypes.c_void_p),
        ("scale", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("y", ctypes.c_void_p),
        ("x16", ctypes.c_void_p),
        ("x_scale", ctypes.c_void_p),
        ("partial", ctypes.c_void_p),
        ("m", ctypes.c_int32),
        ("n", ctypes.c_int32),
        ("k", ctypes.c_int32),
        ("x_bf16", ctypes.c_int32),
        ("splits", ctypes.c_int32),
        ("k_slice", ctypes.c_int32),
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
    lib.radixmesh_fp8_gemv.argtypes = [ctypes.POINTER(_GemvParams), ctypes.c_int, ctypes.c_int64]
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
        and scale.is_contiguous()
    )


def applies(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether `RADIXMESH_FP8_SMALL_M=cuda` asks for this kernel and it serves this call."""
    if os.environ.get(SWITCH, "1") != "cuda" or not x.is_cuda:
        return False
    return shapes_fit(x, q, scale) and library(x.device.index or 0) is not None


def split_k(n: int, k: int, m: int = 1) -> tuple[int, int]:
    """(K slices, columns a slice) for m rows: enough blocks of WARPS slabs of 16 output
    channels for TARGET_BLOCKS, each slice whole 128-column chunks, and no more slices
    than keep the partial sums' traffic within 1 / PARTIAL_TRAFFIC_SHARE of the weights'."""
    blocks = -(-(n // 16) // WARPS)
    traffic_cap = k // (8 * m * PARTIAL_TRAFFIC_SHARE)
    splits = max(1, min(MAX_SPLITS, -(-TARGET_BLOCKS // blocks), k // CHUNK, traffic_cap))
    per_split = -(-k // splits)
    k_slice = -(-per_split // CHUNK) * CHUNK
    return -(-k // k_slice), k_slice


def fp8_gemv_cuda(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [m, k] (1 <= m <= 16) times e4m3 q [n, k] with float32 scales [n] (+ bias [n])
    -> [m, n] in x's dtype (`shapes_fit` must hold)."""
    lib = library(x.device.index or 0)
    assert lib is not None and shapes_fit(x, q, scale), "fp8_gemv_cuda without applies()"
    m, k = x.shape
    n = q.shape[0]
    splits, k_slice = split_k(n, k, m)
    dev = x.device
    y = torch.empty((m, n), dtype=x.dtype, device=dev)
    x16 = torch.empty((MAX_ROWS, k), dtype=torch.float16, device=dev)
    x_scale = torch.empty((MAX_ROWS,), dtype=torch.float32, device=dev)
    partial = torch.empty(
        (splits if splits > 1 else 0, MAX_ROWS, n), dtype=torch.float32, device=dev
    )
    if bias is not None:
        bias = bias.to(x.dtype).contiguous()
    params = _GemvParams(
        x.data_ptr(), q.data_ptr(), scale.data_ptr(), bias.data_ptr() if bias is not None else None,
        y.data_ptr(), x16.data_ptr(), x_scale.data_ptr(), partial.data_ptr(), m, n, k,
        int(x.dtype == torch.bfloat16), splits, k_slice, x.stride(0), q.stride(0), y.stride(0),
    )  # fmt: skip
    stream = torch.cuda.current_stream(dev).cuda_stream
    err = lib.radixmesh_fp8_gemv(ctypes.byref(params), WARPS, stream)
    if err != 0:
        raise RuntimeError(f"FP8 small-batch GEMM launch failed: cudaError {err}")
    return y


def main(argv: list[str] | None = None) -> None:
    """`python -m radixmesh.worker.layers.kernels.fp8_gemv_cuda 8.9 9.0 10.0`: build the
    library for these GPU architectures into RADIXMESH_CUDA_CACHE ahead of time."""
    cuda_library.build_ahead(SOURCE, argv, main.__doc__)


if __name__ == "__main__":
    main()

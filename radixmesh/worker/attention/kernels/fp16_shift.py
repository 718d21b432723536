"""Power-of-two shifts that bring 16-bit query rows and softmax weights into fp16's range,
exactly, for the kernels that multiply an FP8 pool's e4m3 tiles as fp16 (one conversion
per two values; bf16 takes a second per value): the decode kernel's stage 1
(decode_attention.py) and the extend kernel's cached prefix (extend_attention.py)."""

from __future__ import annotations

import triton
import triton.language as tl

from radixmesh.worker.attention.kernels.kv_store import ceil_log2, floor_log2, pow2


@triton.jit
def rows_to_fp16(x):
    """Rows [R, D] as fp16, each shifted by a power of two so its largest |value| is at
    most 2^14: (the fp16 rows, each row's 2^e [R] float32 that undoes the shift)."""
    e = tl.minimum(ceil_log2(tl.max(tl.abs(x.to(tl.float32)), 1) / 16384.0), 126)
    return (x.to(tl.float32) * pow2(-e)[:, None]).to(tl.float16), pow2(e)


@triton.jit
def weights_to_fp16_range(p):
    """Softmax weights [R, N] (float32, >= 0) with each row's largest shifted into [1, 2):
    no fp16 subnormals. Returns (the shifted weights, each row's exponent e [R]: multiply
    a product of the row by 2^e to undo it)."""
    e = floor_log2(tl.max(p, 1))
    return p * pow2(tl.minimum(tl.maximum(-e, -126), 127))[:, None], e

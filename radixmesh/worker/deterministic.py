"""Deterministic (batch-invariant) mode: what `ModelConfig.deterministic` switches on.

A request's output tokens must not depend on who else is served: the batch's size and
composition, whether its prefix came from the cache, where chunked prefill cut its
prompt. Floating-point sums depend on their order, and fast kernels pick their order by
shape (a GEMM's kernel by the row count M, flash-decoding's split count by the batch, an
attention tile by the longest extend); a near tie between two tokens then flips with the
batch. So every reduction whose order depends on anything but the output element's own
inputs is replaced, in this mode only, by one with a fixed order:

- GEMMs (`layers/dense.py`): on CPU in blocks of exactly `dense.CPU_BLOCK_ROWS` rows, one
  call each, because oneDNN's and MKL's kernels change with the row count (measured on
  AMD and Intel CPUs, float32 and bf16). On CUDA cuBLAS without
  a workspace for each shape whose check at start-up passes (`layers/cublas_check.py`),
  else a Triton matmul with one tile configuration per (N, K)
  (`layers/kernels/batch_invariant_matmul.py`).
- Attention: on CPU (`attention/fixed_order.py`) every query sums over its keys in blocks
  of `DETERMINISTIC_BLOCK` from key 0, the same way whether it is a decode row, a cold
  prefill row or a row extending a cached prefix. On CUDA every row, decode rows too, runs
  through the extend kernel with one tile configuration and its query blocks and key
  tiles at absolute positions (`attention/triton_backend.py`): the same sums again.
- The scheduler matches cached prefixes and cuts prefill chunks only at multiples of
  `DETERMINISTIC_BLOCK` (a cached prefix then ends where a cold prefill's key tile does).
- Steps that would run prompt chunks or forced tokens as decode rows (to replay a CUDA
  graph) stop doing so: whether a step qualifies depends on the rest of the batch.

Row-wise ops (RMSNorm, rotary, SiLU, the sampler's softmax, top-k and top-p) already
reduce each row alone, and seeded sampling draws each row from its own generator. The
radix cache, chunked prefill, CUDA graphs and the overlap scheduler stay on.

What is not covered: tensor parallelism's all-reduce order is NCCL's.
"""

from __future__ import annotations

from torch import nn

from radixmesh.worker.attention.base import AttentionBackend
from radixmesh.worker.config import DETERMINISTIC_GEMMS

# Key block of the fixed-order attention, and the alignment of cached prefixes and prefill
# chunks: a multiple of the Triton extend kernel's key tile (64 for head dims <= 128, 32
# above), so aligned prefixes start whole tiles.
DETERMINISTIC_BLOCK = 64


def make_deterministic(
    model: nn.Module,
    attn: AttentionBackend,
    max_context_len: int,
    *,
    max_rows: int = 0,
    gemm: str = "auto",
) -> tuple[int, int]:
    """Switch a loaded model's linear layers and its attention backend to their
    batch-invariant paths. On CUDA with `gemm="auto"` each weight shape whose cuBLAS
    check passes at every row count up to `max_rows` (a step's most tokens) keeps cuBLAS.
    Returns (linear layers switched, those of them on cuBLAS)."""
    from radixmesh.worker.layers.cublas_check import check_rows, rows_invariant
    from radixmesh.worker.layers.dense import PackableLinear

    if gemm not in DETERMINISTIC_GEMMS:
        raise ValueError(f"deterministic_gemm: must be one of {DETERMINISTIC_GEMMS}, got {gemm!r}")
    layers = [m for m in model.modules() if isinstance(m, PackableLinear)]
    verdicts: dict[tuple[object, ...], bool] = {}
    on_cublas = 0
    for layer in layers:
        layer.batch_invariant = True
        w = layer.weight
        if gemm != "auto" or layer.linear_method is not None or not w.is_cuda or max_rows < 1:
            continue
        bias = getattr(layer, "bias", None)
        key = (tuple(w.shape), w.dtype, bias is not None)
        if key not in verdicts:  # with and without the bias (TP's row layers add it later)
            ms = check_rows(max_rows)
            biases = (None,) if bias is None else (None, bias)
            verdicts[key] = not any(rows_invariant(w, b, ms) for b in biases)
        layer.cublas_invariant = verdicts[key]
        on_cublas += verdicts[key]
    attn.enable_deterministic(max_context_len)
    return len(layers), on_cublas

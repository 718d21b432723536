"""The FP8 GEMM kernel table: which kernel serves a linear call of 1-16 rows, per shape and
row bucket, from microseconds measured on this GPU (fp8_gemm_choice.py measures them, reads
and writes the files, and hands each model's `Fp8LinearMethod` its table; fp8.py asks it at
every call). A module of its own so that fp8.py, which asks, need not import the module
that measures, which calls fp8.py's kernels.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import torch

KERNELS = ("small_m", "cuda_gemv", "scaled_mm", "tensorwise_mm")
MAX_ROWS = 16  # fp8_small_m.MAX_ROWS: the small-batch kernels' rows
LARGE_KERNELS = frozenset({"scaled_mm", "tensorwise_mm"})  # those past MAX_ROWS
# The fixed rule's kernel, each entry's default: the small-batch kernel at 1-16 rows,
# row-wise `_scaled_mm` past them.
DEFAULT = "small_m"
LARGE_DEFAULT = "scaled_mm"
SMALL_BUCKETS = (1, 2, 4, 8, 16)
# Past 16 rows only `_scaled_mm`'s two forms compete (row-wise scaling, or tensor-wise with
# the scales' epilogue, fp8.py), on per-channel bfloat16 shapes. Up to a default prefill
# step's token budget; a call past the last bucket takes the fixed rule.
LARGE_BUCKETS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
BUCKETS = SMALL_BUCKETS + LARGE_BUCKETS
MAX_TABLE_ROWS = BUCKETS[-1]
# Row count -> its bucket, by index (0 has none): the call's lookup, no search.
BUCKET_OF: tuple[int, ...] = (
    0,
    *(next(b for b in BUCKETS if t <= b) for t in range(1, MAX_TABLE_ROWS + 1)),
)
# A kernel replaces the default only when it takes less than (1 - MARGIN) of the default's
# time. The same shape timed in separate runs moved 1-2% on the H200 (the small-batch
# sweeps of 2026-12-01 and -02), so a 5% margin keeps a near tie from flipping kernels
# (and output bits) from one measurement to the next; what it can cost is under 5% of a
# GEMM whose candidates were that close anyway.
MARGIN = 0.05

LAYOUTS = {1: "channel", 2: "group"}  # the scale's dims -> layout


@dataclass(frozen=True, order=True)
class Shape:
    """A distinct FP8 linear: out features n, in features k, scale layout, rows' dtype."""

    n: int
    k: int
    layout: str  # "channel" (scales [n]) or "group" (scales [n, ceil(k/128)])
    dtype: str  # "bfloat16" or "float16": the activations'

    def at(self, rows: int) -> EntryKey:
        return (self.n, self.k, self.layout, self.dtype, rows)

    @property
    def buckets(self) -> tuple[int, ...]:
        return buckets_for(self.layout, self.dtype)


EntryKey = tuple[int, int, str, str, int]  # Shape's fields + the row bucket
Timings = dict[EntryKey, dict[str, float]]  # -> kernel name -> microseconds


def bucket(rows: int) -> int:
    """The row bucket of a call of `rows` rows (1 to MAX_TABLE_ROWS)."""
    if not 1 <= rows <= MAX_TABLE_ROWS:
        raise ValueError(f"rows must be 1-{MAX_TABLE_ROWS}, got {rows}")
    return BUCKET_OF[rows]


def buckets_for(layout: str, dtype: str) -> tuple[int, ...]:
    """The buckets timed for a shape: past 16 rows only per-channel bfloat16 shapes have
    two kernels to choose from (`_scaled_mm`'s two forms)."""
    return BUCKETS if (layout, dtype) == ("channel", "bfloat16") else SMALL_BUCKETS


def candidates(rows: int) -> frozenset[str]:
    """The kernels that can serve a bucket of `rows` rows."""
    return frozenset(KERNELS) if rows <= MAX_ROWS else LARGE_KERNELS


def default_for(rows: int) -> str:
    """The fixed rule's kernel for a bucket of `rows` rows."""
    return DEFAULT if rows <= MAX_ROWS else LARGE_DEFAULT


def choose(
    us: Mapping[str, float], available: Collection[str], default: str = DEFAULT
) -> str | None:
    """The kernel for one entry: `default` unless the fastest available kernel takes
    less than (1 - MARGIN) of its time; the fastest if the default did not run; None if
    nothing ran."""
    ran = {name: t for name, t in us.items() if name in available and math.isfinite(t)}
    if not ran:
        return None
    best = min(ran, key=lambda name: (ran[name], name))
    if default not in ran:
        return best
    return best if ran[best] < ran[default] * (1 - MARGIN) else default


class GemmTable:
    """The measured choices of one model on one GPU: (n, k, layout, dtype, bucket) ->
    kernel, where it is not the default."""

    def __init__(self, timings: Timings, available: Collection[str]) -> None:
        self.timings = dict(timings)
        self.available = frozenset(available)
        self.choices: dict[EntryKey, str] = {}
        # The call's key: scale dims (1 or 2) and torch dtype instead of their names.
        self._by_call: dict[tuple[int, int, int, int, torch.dtype], str] = {}
        dims = {layout: d for d, layout in LAYOUTS.items()}
        for key, us in self.timings.items():
            n, k, layout, dtype, rows = key
            default = default_for(rows)
            kernel = choose(us, self.available & candidates(rows), default)
            if kernel is None or kernel == default:
                continue
            self.choices[key] = kernel
            self._by_call[(n, k, dims[layout], rows, getattr(torch, dtype))] = kernel

    def kernel_for(
        self, rows: int, dtype: torch.dtype, q: torch.Tensor, scale: torch.Tensor
    ) -> str | None:
        """The kernel for `rows` rows of `dtype` activations times q [n, k] (scales
        `scale`) where it is not the fixed rule's, else None."""
        if not 0 < rows <= MAX_TABLE_ROWS:
            return None
        return self._by_call.get((q.shape[0], q.shape[1], scale.dim(), BUCKET_OF[rows], dtype))

    def kernel(self, shape: Shape, rows: int) -> str:
        """The kernel a call of `rows` rows of `shape` takes (the fixed rule's where none
        was chosen)."""
        b = bucket(rows)
        return self.choices.get(shape.at(b), default_for(b))

    def describe(self, shapes: Iterable[Shape]) -> list[str]:
        """One line per shape: each bucket's kernel and every kernel's microseconds."""
        lines = []
        for shape in shapes:
            parts = []
            for rows in shape.buckets:
                us = self.timings.get(shape.at(rows), {})
                times = " ".join(f"{name} {us[name]:.1f}" for name in KERNELS if name in us)
                parts.append(f"{rows}: {self.kernel(shape, rows)} ({times or 'not timed'})")
            head = f"FP8 GEMM ({shape.n}, {shape.k}) {shape.layout} {shape.dtype}"
            lines.append(f"{head}, rows -> kernel (us): " + "; ".join(parts))
        return lines

"""Which FP8 GEMM kernel serves a linear call: a table measured at load.

Four kernels can multiply rows by e4m3 weights on CUDA (fp8.py says what each does), and
which is fastest depends on the GPU, the shape and the row count:
  small_m        the Triton weight-only kernel (layers/kernels/fp8_small_m.py): the fixed
                 rule's choice at 1-16 rows, so the default of those entries (`DEFAULT`)
  cuda_gemv      the CUDA C++ kernel of the same job (layers/kernels/fp8_gemv_cuda.py),
                 1-16 rows, where it builds or is built (sm_89+, nvcc or a library already
                 in the cache) and the shape fits (per-channel scales, n % 16, k % 128,
                 aligned rows)
  scaled_mm      per-token activation quantization + `torch._scaled_mm` with row-wise
                 scales (sm90+, bfloat16, per-channel scales): the fixed rule past 16
                 rows, so the default of those entries (`LARGE_DEFAULT`)
  tensorwise_mm  the same quantization + the tensor-wise `_scaled_mm` into float32, then
                 the scales in one pass (layers/kernels/fp8_epilogue.py): cuBLAS's
                 tensor-wise FP8 GEMM outran the row-wise one by 1.6x on the 4,096-column
                 shapes at 256 rows on the H200, and the pass costs what the float32
                 output's size does, so where it pays is measured.
Past 16 rows only the last two compete, on per-channel bfloat16 shapes (`buckets_for`);
past the last bucket (`MAX_TABLE_ROWS`) the fixed rule.

The table: for each distinct (out features n, in features k, scale layout "channel" or
"group", activation dtype) of the loaded model's FP8 layers and each row bucket
(`BUCKETS`, powers of two to MAX_TABLE_ROWS: a call of t rows takes the smallest bucket
>= t, timed at the bucket's row count, its slowest), the microseconds of every kernel
that applies, timed on this GPU with the layers' own weights (`CudaMeasurer`: CUDA graphs
of `timing.CALLS` calls, fewer past 256 rows (`calls_for`), cycling through the layers of
that shape, so the weights come cold from L2 as in a decode step, median of
`timing.REPEATS`; each kernel's output first checked against the dequantize reference, a
kernel that fails or errs is never chosen). The dtype is in the key because the
`_scaled_mm` forms serve bfloat16 only and fp16 rows time differently. An entry replaces
its bucket's default only where a kernel beats it by more than `MARGIN` (`choose`).

Why timings and not decisions are stored: the margin and the set of kernels available
on this machine (a shipped table may name `cuda_gemv` where nvcc is missing) apply when
the table is built, so neither needs a re-measurement.

Where the timings come from, first to last (`prepare`, called by the worker after the
weights load and before the KV pool is sized and the decode CUDA graphs are captured,
which bake the kernel choice in):
1. a shipped table, `fp8_gemm_tables/<gpu>.json` next to this module (package data;
   <gpu> is `gpu_slug` of the device's name, e.g. nvidia-h200.json), used where its
   `key`'s gpu, capability and kernels (a hash of the candidate kernels' sources,
   `kernel_sources`) equal this machine's: a kernel edit invalidates it, a torch or
   triton upgrade does not (the image pins those; they are recorded for the reader);
2. the cache, `fp8_gemm/<gpu>.json` under RADIXMESH_CACHE_DIR (~/.cache/radixmesh; the
   CUDA libraries' cache root, worker/cuda_library.py), used where its whole `key`
   equals this machine's (`CudaMeasurer.fingerprint`: gpu, capability, torch, CUDA,
   triton, kernels, the kernels available here);
3. measured now, for whatever shapes and buckets 1 and 2 lack, then written to the cache
   (merged with its entries, atomically: tensor-parallel ranks, which each measure their
   own GPU, may write at once).
A corrupt or mismatched file is ignored (logged once), never fatal; a cache that cannot
be written is logged and the table still used.

File format (both): {"format": 1, "key": {...fingerprint...}, "entries": [{"n": 6144,
"k": 4096, "layout": "channel", "dtype": "bfloat16", "rows": 4, "us": {"small_m": <us>,
"scaled_mm": <us>}}, ...]}: `rows` is the bucket, `us` the kernels that ran and passed.

Switches, read at load: `RADIXMESH_FP8_GEMM_TABLE=0` measures nothing and builds no
table (the fixed rule). `RADIXMESH_FP8_SMALL_M=0` or `=cuda` are a user's explicit
choice and win: no table either (fp8.py then does what each forced before), nor with
`RADIXMESH_FUSED_KERNELS=0` (no small-batch kernel runs) or 32-bit activations. Deterministic
mode (worker/deterministic.py) measures nothing and keeps the fixed rule: the kernels sum
in different orders, so a kernel picked by timings that vary from start to start would
change a request's output bits between starts of the same engine.

The table lives on the model's `Fp8LinearMethod` (`gemm_table`), not in a global: two
engines in one process (one deterministic, or a draft model) keep their own. Looking a
call up (`GemmTable.kernel_for`) is one tuple and one dict lookup, no allocation on the
device, no sync and no environment read, since it runs at every forward and in CUDA
graph capture.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from radixmesh.model_source import cache_root
from radixmesh.worker.layers.dense import PackableLinear
from radixmesh.worker.layers.quantization.fp8 import (
    Fp8LinearMethod,
    fp8_linear_ref,
    fp8_linear_scaled_mm,
    fp8_linear_tensorwise,
    quantize_rows,
    scaled_mm_applies,
    unit_scale,
)
from radixmesh.worker.layers.quantization.fp8_gemm_table import (
    BUCKETS,
    DEFAULT,
    KERNELS,
    LAYOUTS,
    MAX_ROWS,
    EntryKey,
    GemmTable,
    Shape,
    Timings,
)

log = logging.getLogger(__name__)

TABLE_SWITCH = "RADIXMESH_FP8_GEMM_TABLE"  # "0": no measurement, no table
SMALL_M_SWITCH = "RADIXMESH_FP8_SMALL_M"  # fp8.SMALL_M_SWITCH: "0" / "cuda" force a path
FORMAT = 1
SHIPPED_DIR = Path(__file__).parent / "fp8_gemm_tables"
# A kernel's output against the dequantize reference in float32 (relative Frobenius
# error; scaled_mm's reference takes its own per-token quantized rows) before it may be
# timed: each rounds only its 16-bit output (the small-batch tests bound that by 4e-3;
# 8e-3 leaves room for fp16 operands). The check catches a broken kernel (errors near 1).
CHECK_BOUND = 8e-3
# Copies of the weights a timing cycles through (the model's own layers of a shape) at
# most: one per call of the timing graph.
MAX_OPERANDS = 20

# A weight's operands: e4m3 q [n, k], float32 scale [n] or [n, groups], bias [n] or None.
Operand = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


class Measurer(Protocol):
    """Times the kernels on one device (`CudaMeasurer`; tests inject their own)."""

    def fingerprint(self) -> dict[str, Any]:
        """What a cached table must have been measured with: gpu, capability, ..."""
        ...

    def available(self) -> frozenset[str]:
        """The kernels that may run on this device (before the shape's own conditions)."""
        ...

    def time(self, shape: Shape, operands: Sequence[Operand], rows: int) -> dict[str, float]:
        """kernel -> microseconds at `rows` rows, for each kernel that applies, ran and
        passed the check."""
        ...


def kernel_sources() -> list[Path]:
    """The files whose code the candidates run: an edit to any re-measures."""
    here = Path(__file__).parent
    kernels = here.parent / "kernels"
    worker = here.parent.parent
    files = [
        kernels / "fp8_small_m.py",
        kernels / "fp8_gemv_cuda.py",
        kernels / "fp8_quant.py",
        kernels / "fp8_epilogue.py",
        here / "fp8_activation.py",
        *sorted((kernels / "cuda").glob("fp8_gemv*.cu")),
        *sorted((worker / "cuda").glob("*.cuh")),
    ]
    return [f for f in files if f.is_file()]


def sources_hash(files: Iterable[Path] | None = None) -> str:
    h = hashlib.sha256()
    for f in kernel_sources() if files is None else files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def gpu_slug(name: str) -> str:
    """A GPU name as a file name: "NVIDIA H200" -> "nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative (Frobenius) error of `out` against `ref`, in float32."""
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


class CudaMeasurer:
    """Times the candidates on a CUDA device (`timing.time_us`), each checked first."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self._available: frozenset[str] | None = None
        self._failed: set[str] = set()  # kernels whose failure was logged

    def fingerprint(self) -> dict[str, Any]:
        import triton

        major, minor = torch.cuda.get_device_capability(self.index)
        return {
            "gpu": torch.cuda.get_device_name(self.index),
            "capability": f"{major}.{minor}",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": triton.__version__,
            "kernels": sources_hash(),
            "available": sorted(self.available()),
        }

    def available(self) -> frozenset[str]:
        if self._available is None:
            self._available = frozenset(self._find_available())
        return self._available

    def _find_available(self) -> list[str]:
        from radixmesh.worker import cuda_library
        from radixmesh.worker.layers.kernels import fp8_gemv_cuda

        capability = torch.cuda.get_device_capability(self.index)
        found = [DEFAULT]
        # Only where it can load without building, or nvcc can build it: else asking for
        # it would log a warning for a kernel nobody asked for.
        built = cuda_library.library_path(
            fp8_gemv_cuda.SOURCE, capability, cuda_library.cache_dir()
        ).is_file()
        buildable = built or cuda_library.nvcc() is not None
        if capability >= (8, 9) and buildable and fp8_gemv_cuda.library(self.index) is not None:
            found.append("cuda_gemv")
        if capability >= (9, 0):
            found += ["scaled_mm", "tensorwise_mm"]
        return found

    def time(self, shape: Shape, operands: Sequence[Operand], rows: int) -> dict[str, float]:
        from radixmesh.worker.layers.kernels.timing import time_us

        dtype = getattr(torch, shape.dtype)
        gen = torch.Generator(device=self.device).manual_seed(shape.n + shape.k + rows)
        x = torch.randn(rows, shape.k, device=self.device, generator=gen).to(dtype)
        out: dict[str, float] = {}
        for name in KERNELS:
            fn = self._kernel(name, shape, operands, x)
            if fn is None:
                continue
            try:
                err = self._check(name, fn, x, operands[0])
                if not err <= CHECK_BOUND:  # NaN too
                    raise RuntimeError(f"relative error {err:.2e} > {CHECK_BOUND:.0e}")
                calls = calls_for(rows)
                out[name] = time_us(functools.partial(_cycled, fn, x, operands), calls=calls)
            except Exception as e:  # a kernel that fails is not chosen; the load goes on
                if name not in self._failed:
                    self._failed.add(name)
                    log.warning(
                        "FP8 GEMM %s on %s at %d rows: %s; not chosen", name, shape, rows, e
                    )
        return out

    @staticmethod
    def _check(name: str, fn: Any, x: torch.Tensor, op: Operand) -> float:
        from radixmesh.worker.layers.quantization.fp8_scales import dequantize_rows

        q, scale, bias = op
        ref_x = x.float()
        if name in ("scaled_mm", "tensorwise_mm"):  # against its own quantized rows
            xq, xs = quantize_rows(x.float())
            ref_x = dequantize_rows(xq, xs, torch.float32)
        ref = fp8_linear_ref(ref_x, q, scale, None if bias is None else bias.float())
        return rel_err(fn(x, q, scale, bias), ref)

    def _kernel(
        self, name: str, shape: Shape, operands: Sequence[Operand], x: torch.Tensor
    ) -> Any | None:
        """The kernel's call (x, q, scale, bias) -> y, or None where it does not apply."""
        if name not in self.available():
            return None
        if x.shape[0] > MAX_ROWS and name in ("small_m", "cuda_gemv"):
            return None
        if name == "small_m":
            from radixmesh.worker.layers.kernels.fp8_small_m import fp8_small_m_linear

            return fp8_small_m_linear
        if name == "cuda_gemv":
            from radixmesh.worker.layers.kernels import fp8_gemv_cuda

            if all(fp8_gemv_cuda.shapes_fit(x, q, s) for q, s, _ in operands):
                return fp8_gemv_cuda.fp8_gemv_cuda
            return None

        if shape.layout != "channel" or not scaled_mm_applies(x, operands[0][0]):
            return None
        return fp8_linear_tensorwise if name == "tensorwise_mm" else fp8_linear_scaled_mm


def calls_for(rows: int) -> int:
    """Calls in a timing graph of `rows` rows: `timing.CALLS` up to 256 rows, fewer past
    them (down to 2), so that a graph's outputs (float32 [rows, n] for `tensorwise_mm`)
    stay within a few GB."""
    from radixmesh.worker.layers.kernels.timing import CALLS

    return max(2, min(CALLS, CALLS * 256 // rows))


def _cycled(fn: Any, x: torch.Tensor, operands: Sequence[Operand], i: int) -> torch.Tensor:
    """The graph's call i: x times the weights of layer i (cycled), cold in L2."""
    y: torch.Tensor = fn(x, *operands[i % len(operands)])
    return y


def measure(
    shapes: Mapping[Shape, Sequence[Operand]],
    measurer: Measurer,
    known: Mapping[EntryKey, Any] | None = None,
) -> Timings:
    """Each shape at each bucket that `known` lacks, timed by `measurer`."""
    out: Timings = {}
    for shape, operands in shapes.items():
        for rows in shape.buckets:
            key = shape.at(rows)
            if known is None or key not in known:
                out[key] = measurer.time(shape, operands, rows)
    return out


# ---- files ------------------------------------------------------------------------------

_warned: set[str] = set()


def _warn_once(path: Path, message: str, *args: Any) -> None:
    if str(path) not in _warned:
        _warned.add(str(path))
        log.warning(message, *args)


def read_table(path: Path) -> tuple[dict[str, Any], Timings] | None:
    """(key, timings) of a table file; None if absent, or unreadable or malformed (logged
    once per path)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not format {FORMAT}")
        key = data["key"]
        if not isinstance(key, dict):
            raise ValueError("key is not an object")
        timings: Timings = {}
        for e in data["entries"]:
            us = {str(name): float(t) for name, t in e["us"].items()}
            if e["layout"] not in LAYOUTS.values() or not isinstance(
                getattr(torch, e["dtype"], None), torch.dtype
            ):
                raise ValueError(f"bad entry {e!r}")
            if int(e["rows"]) not in BUCKETS:
                raise ValueError(f"rows {e['rows']!r} is not a bucket {BUCKETS}")
            timings[(int(e["n"]), int(e["k"]), e["layout"], e["dtype"], int(e["rows"]))] = us
        return key, timings
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        _warn_once(path, "FP8 GEMM table %s ignored: %s", path, e)
        return None


def table_data(key: Mapping[str, Any], timings: Timings) -> dict[str, Any]:
    """A table file's content (the module docstring's format)."""
    entries = [
        {"n": n, "k": k, "layout": layout, "dtype": dtype, "rows": rows, "us": timings[e]}
        for e in sorted(timings)
        for n, k, layout, dtype, rows in (e,)
    ]
    return {"format": FORMAT, "key": dict(key), "entries": entries}


def write_table(path: Path, key: Mapping[str, Any], timings: Timings) -> None:
    """Write a table file atomically (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(table_data(key, timings), indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def cache_path(gpu: str, cache_dir: Path | None = None) -> Path:
    return (cache_dir or cache_root() / "fp8_gemm") / f"{gpu_slug(gpu)}.json"


SHIPPED_MATCH = ("gpu", "capability", "kernels")  # a shipped table's key fields that must match


# ---- at load ----------------------------------------------------------------------------


def fp8_layers(model: nn.Module, dtype: torch.dtype) -> dict[Shape, list[PackableLinear]]:
    """The model's FP8 linear layers by shape (their weights' [n, k], scale layout) for
    activations of `dtype`."""

    out: dict[Shape, list[PackableLinear]] = {}
    name = str(dtype).removeprefix("torch.")
    for m in model.modules():
        if isinstance(m, PackableLinear) and isinstance(m.linear_method, Fp8LinearMethod):
            n, k = m.weight.shape
            shape = Shape(int(n), int(k), LAYOUTS[m.weight_scale.dim()], name)
            out.setdefault(shape, []).append(m)
    return out


def fp8_methods(layers: Mapping[Shape, Sequence[PackableLinear]]) -> list[Fp8LinearMethod]:
    """The distinct methods of the layers (one a model, as quantize_linears makes it)."""

    out: dict[int, Fp8LinearMethod] = {}
    for ms in layers.values():
        for m in ms:
            if isinstance(m.linear_method, Fp8LinearMethod):
                out[id(m.linear_method)] = m.linear_method
    return list(out.values())


def operands_of(layers: Sequence[PackableLinear]) -> list[Operand]:
    """Up to MAX_OPERANDS layers' (q, scale, bias), the timing's cold weights."""
    out: list[Operand] = []
    for m in layers[:MAX_OPERANDS]:
        bias = getattr(m, "bias", None)
        out.append((m.weight, m.weight_scale, bias if isinstance(bias, torch.Tensor) else None))
    return out


def switched_off(deterministic: bool) -> str | None:
    """Why no table is built, or None."""
    if deterministic:
        return "deterministic mode (a timing-chosen kernel would change bits between starts)"
    if os.environ.get(TABLE_SWITCH, "1") == "0":
        return f"{TABLE_SWITCH}=0"
    forced = os.environ.get(SMALL_M_SWITCH, "1")
    if forced in ("0", "cuda"):
        return f"{SMALL_M_SWITCH}={forced} chooses the kernel"
    from radixmesh.worker.layers import kernels

    if os.environ.get(kernels.ENV_SWITCH, "1") == "0":  # fp8.small_m_applies: never
        return f"{kernels.ENV_SWITCH}=0: no small-batch kernel"
    return None


@dataclass
class Report:
    """What `prepare` did, for the log."""

    shapes: list[Shape]
    table: GemmTable | None
    reason: str = ""  # why there is no table
    seconds: float = 0.0
    measured: int = 0  # entries timed now
    shipped: int = 0  # entries from a shipped table
    cached: int = 0  # entries from the cache
    cache_file: Path | None = None
    lines: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.table is None:
            return f"FP8 GEMM table off ({self.reason}): the fixed rule"
        return (
            f"FP8 GEMM table: {len(self.shapes)} shapes, up to {len(BUCKETS)} row buckets, "
            f"{self.measured} entries measured, {self.cached} cached, {self.shipped} shipped, "
            f"in {self.seconds:.1f} s (cache {self.cache_file})"
        )


def prepare(
    model: nn.Module,
    dtype: torch.dtype,
    measurer: Measurer,
    *,
    deterministic: bool = False,
    cache_dir: Path | None = None,
    shipped_dir: Path = SHIPPED_DIR,
) -> Report | None:
    """Build the model's table and hand it to its FP8 layers' methods (`gemm_table`);
    None if the model has no FP8 layer. Without a table (switched off, deterministic) the
    methods' table is cleared: the fixed rule."""
    t0 = time.perf_counter()
    layers = fp8_layers(model, dtype)
    if not layers:
        return None
    methods = fp8_methods(layers)
    shapes = sorted(layers)
    reason = switched_off(deterministic)
    if dtype not in (torch.bfloat16, torch.float16):
        reason = f"{dtype} activations: the small-batch kernels take 16-bit ones"
    if reason is not None:
        for method in methods:
            method.gemm_table = None
        return Report(shapes, None, reason)
    key = measurer.fingerprint()
    timings: Timings = {}
    report = Report(shapes, None)
    shipped = read_table(shipped_dir / f"{gpu_slug(key['gpu'])}.json")
    if shipped is not None:
        ship_key, ship_timings = shipped
        if all(ship_key.get(f) == key.get(f) for f in SHIPPED_MATCH):
            timings.update(ship_timings)
        else:
            _warn_once(shipped_dir, "FP8 GEMM shipped table for %s measured with other kernels; "
                       "measuring", key["gpu"])  # fmt: skip
    wanted = {s.at(rows) for s in shapes for rows in s.buckets}
    report.shipped = len(wanted & timings.keys())
    path = cache_path(key["gpu"], cache_dir)
    report.cache_file = path
    cached = read_table(path)
    cache_timings: Timings = {}
    if cached is not None:
        if cached[0] == key:
            cache_timings = cached[1]
        else:
            _warn_once(path, "FP8 GEMM table %s measured on another setup; measuring", path)
    fresh_from_cache = {e: us for e, us in cache_timings.items() if e not in timings}
    report.cached = len(wanted & fresh_from_cache.keys())
    timings.update(fresh_from_cache)
    missing = {
        s: operands_of(layers[s]) for s in shapes if any(s.at(r) not in timings for r in s.buckets)
    }
    new = measure(missing, measurer, timings)
    report.measured = len(new)
    timings.update(new)
    if new:
        try:
            write_table(path, key, {**cache_timings, **new})
        except OSError as e:
            log.warning(
                "FP8 GEMM table: could not write %s (%s); measured again next start", path, e
            )
    table = GemmTable({e: timings[e] for e in wanted if e in timings}, measurer.available())
    device = next(iter(layers.values()))[0].weight.device
    if device.type == "cuda":  # before any graph capture can be the first to ask for it
        unit_scale(device.index or 0)
    for method in methods:
        method.gemm_table = table
    report.table = table
    report.seconds = time.perf_counter() - t0
    report.lines = table.describe(shapes)
    return report

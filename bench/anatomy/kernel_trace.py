"""A torch.profiler trace as kernels per engine step (bench/anatomy/prefill.py).

A kernel belongs to the step in which it was launched: its CUDA runtime/driver call (same
correlation id) lies in the step's `anatomy::step` range on the scheduler thread; failing
that, its GPU start does. Its CPU op is the one it was launched under (Kineto's linked
correlation id), which gives a GEMM's shapes. The `anatomy::<region>` ranges (sampling,
attention, norm, activation) classify what kernel names cannot. Without device events (a
CPU run) the "kernels" are the innermost GEMM ops and the leaf ops outside them.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

LABEL = "anatomy::"
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_mm", "mkldnn::_linear_pointwise")
TRITON = {
    "_extend_kernel": "attention",
    "_decode_split_kernel": "attention",
    "_decode_merge_kernel": "attention",
    "_prefix_kernel": "attention",  # decode_shared.py: shared prefixes read once per chunk
    "_kv_store_kernel": "kv_store",
    "_rms_norm_kernel": "norm",
    "_rotary_kernel": "rotary",
    "_silu_and_mul_kernel": "activation",
    # FP8 weights' GEMM path: the small-batch kernel, its slices' sum, and the per-token
    # quantization of the activations that the larger batches' _scaled_mm takes
    "_fp8_small_m_kernel": "gemm",
    "_sum_slices_kernel": "gemm",
    "_per_token_fp8_kernel": "gemm",
    "_scale_rows_cols_kernel": "gemm",  # the tensor-wise FP8 GEMM's scale epilogue
}
GEMM_NAMES = ("gemm", "nvjet", "xmma", "cutlass", "gemv", "cublas", "sm90_", "splitk")


# ---- events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """A profiler event, device-neutral: times in ns; `corr` the event's correlation id,
    `linked` (device events) the CPU op it was launched under."""

    name: str
    on_device: bool
    start: int
    end: int
    corr: int = 0
    linked: int = 0
    shapes: tuple[tuple[int, ...], ...] = ()


@dataclass
class Kernel:
    name: str
    start: int
    end: int
    launch: int | None  # when the CPU launched it (None: unknown)
    op: Event | None  # the CPU op it ran under (a GEMM's shapes)


def trace_events(prof: Any) -> list[Event]:
    """The profile's raw Kineto events (torch's own per-event objects are slower to
    build and drop the launch links)."""
    out = []
    for e in prof.profiler.kineto_results.events():
        name = e.name()
        if name.startswith("["):  # the profiler's own markers
            continue
        shapes = tuple(_shape(s) for s in e.shapes())
        out.append(
            Event(
                name,
                str(e.device_type()).endswith("CUDA"),
                int(e.start_ns()),
                int(e.end_ns()),
                int(e.correlation_id()),
                int(e.linked_correlation_id()),
                shapes,
            )
        )
    return out


def _shape(s: Any) -> tuple[int, ...]:
    """A tensor's recorded sizes; () for a scalar, a list of tensors or anything else."""
    if isinstance(s, list | tuple) and all(isinstance(d, int) for d in s):
        return tuple(s)
    return ()


def windows(events: Iterable[Event]) -> dict[str, list[tuple[int, int]]]:
    """The `anatomy::` ranges on the CPU, by region, sorted."""
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if not e.on_device and e.name.startswith(LABEL):
            out[e.name[len(LABEL) :]].append((e.start, e.end))
    for v in out.values():
        v.sort()
    return out


def kernels(events: list[Event]) -> list[Kernel]:
    """Device events with their launch time and CPU op; without any (a CPU run), the
    innermost GEMM ops and the leaf ops outside them."""
    device = [e for e in events if e.on_device and not e.name.startswith(LABEL)]
    cpu = [e for e in events if not e.on_device and not e.name.startswith(LABEL)]
    if not device:
        return _cpu_kernels(cpu)
    ops = {e.corr: e for e in cpu if "::" in e.name}
    runtime = {e.corr: e for e in cpu if "::" not in e.name}  # CUDA runtime/driver calls
    out = []
    for e in device:
        call = runtime.get(e.corr)
        op = ops.get(e.linked) or (ops.get(call.linked) if call is not None else None)
        out.append(Kernel(e.name, e.start, e.end, call.start if call else None, op))
    return out


def _cpu_kernels(ops: list[Event]) -> list[Kernel]:
    ops = sorted((e for e in ops if "::" in e.name), key=lambda e: (e.start, -e.end))
    parent: list[int] = [-1] * len(ops)
    has_child = [False] * len(ops)
    stack: list[int] = []
    for i, e in enumerate(ops):
        while stack and ops[stack[-1]].end <= e.start:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            has_child[stack[-1]] = True
        stack.append(i)

    def under_gemm(i: int) -> bool:
        i = parent[i]
        while i >= 0:
            if ops[i].name in GEMM_OPS:
                return True
            i = parent[i]
        return False

    return [
        Kernel(e.name, e.start, e.end, e.start, e)
        for i, e in enumerate(ops)
        if not under_gemm(i) and (e.name in GEMM_OPS or not has_child[i])
    ]


def gemm_mnk(op: Event) -> tuple[int, int, int] | None:
    """M x N x K of a GEMM op from its recorded input shapes (None: not a known form)."""
    s = [x for x in op.shapes if x]
    try:
        if op.name in ("aten::mm", "aten::_scaled_mm"):
            (m, k), (_, n) = s[0], s[1]
        elif op.name == "aten::addmm":
            (m, k), (_, n) = s[-2], s[-1]
        elif op.name == "aten::bmm":
            (b, m, k), (_, _, n) = s[0], s[1]
            m *= b
        elif op.name == "mkldnn::_linear_pointwise":
            (m, k), (n, _) = s[0], s[1]
        else:
            return None
    except (ValueError, IndexError):
        return None
    return int(m), int(n), int(k)


def category(k: Kernel, region: str | None) -> str:
    for key, cat in TRITON.items():
        if key in k.name:
            return cat
    if region == "attention":  # the torch backend's ops (CPU), the mixed step's gathers
        return "attention"
    low = k.name.lower()
    if (k.op is not None and k.op.name in GEMM_OPS) or any(g in low for g in GEMM_NAMES):
        return "gemm"
    if region in ("sampling", "norm", "activation"):
        return region
    if "memcpy" in low or "memset" in low:
        return "copy"
    return "other"


# ---- per step --------------------------------------------------------------------------


@dataclass
class StepKernels:
    info: Any  # prefill_anatomy.StepInfo: its kind and rows
    kernels: list[tuple[Kernel, str]] = field(default_factory=list)


class _Windows:
    """Which `anatomy::<region>` range holds a CPU timestamp."""

    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        self.ranges = ranges
        self.starts = [s for s, _ in ranges]

    def index(self, t: int, strict: bool = True) -> int | None:
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0 or (strict and t > self.ranges[i][1]):
            return None
        return i


def assign(
    steps: list[Any], ks: list[Kernel], ranges: dict[str, list[tuple[int, int]]]
) -> tuple[list[StepKernels], int]:
    """Each kernel to the step (and region) it was launched in; the count left over."""
    step_windows = _Windows(ranges.get("step", [])[: len(steps)])
    regions = {r: _Windows(v) for r, v in ranges.items() if r != "step"}
    out = [StepKernels(info) for info in steps]
    lost = 0
    for k in ks:
        t = k.launch if k.launch is not None else (k.op.start if k.op is not None else None)
        i = step_windows.index(t) if t is not None else step_windows.index(k.start, False)
        if i is None:
            lost += 1
            continue
        region = None
        if t is not None:
            region = next((r for r, w in regions.items() if w.index(t) is not None), None)
        out[i].kernels.append((k, category(k, region)))
    return out, lost


def busy_time(intervals: Iterable[tuple[float, float]]) -> float:
    """The time covered by the union of [start, end) intervals (non-negative times)."""
    busy: float = 0
    cur_s: float = 0
    cur_e: float = -1
    for s, e in sorted(intervals):
        if s > cur_e:
            busy += max(0, cur_e - cur_s)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return busy + max(0, cur_e - cur_s)


def step_figures(steps: list[StepKernels]) -> list[dict[str, Any]]:
    """Per step: span (to the next step's first kernel), busy, time by category (ms)."""
    firsts = [min((k.start for k, _ in s.kernels), default=None) for s in steps]
    out = []
    for i, s in enumerate(steps):
        if not s.kernels:
            out.append({"span_ms": 0.0, "busy_ms": 0.0, "kernels": 0, "by_category_ms": {}})
            continue
        first = min(k.start for k, _ in s.kernels)
        nxt = next((f for f in firsts[i + 1 :] if f is not None), None)
        end = nxt if nxt is not None else max(k.end for k, _ in s.kernels)
        by_cat: dict[str, float] = defaultdict(float)
        for k, cat in s.kernels:
            by_cat[cat] += (k.end - k.start) / 1e6
        out.append(
            {
                "span_ms": (end - first) / 1e6,
                "busy_ms": busy_time([(k.start, k.end) for k, _ in s.kernels]) / 1e6,
                "kernels": len(s.kernels),
                "by_category_ms": dict(by_cat),
            }
        )
    return out

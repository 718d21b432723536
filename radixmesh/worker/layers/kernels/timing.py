"""GPU time of a kernel call: CUDA graphs of several calls, median of a few replays.

One definition for the benchmarks (bench/fp8_gemm.py, bench/fp8_sweep.py) and the
product's own measurements (layers/quantization/fp8_gemm_choice.py, at load). A graph
replays its calls back to back with no launch gaps, so a microsecond kernel is timed as a
decode step's CUDA graph runs it, not as Python launches it; the median drops a replay
that another process or the clock disturbed. Imports torch (and graph_capture) only.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from radixmesh.worker.layers.kernels.graph_capture import capture

CALLS = 20
REPEATS = 9


def time_us(fn: Callable[[int], Any], calls: int = CALLS, repeats: int = REPEATS) -> float:
    """Microseconds a call of `fn(i)` (i: the call's index in the graph), CUDA graphs of
    `calls` calls, median of `repeats`. `fn` runs once eagerly first (compiles, warms up),
    outside the graph."""
    fn(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture(graph):
        for i in range(calls):
            fn(i)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)

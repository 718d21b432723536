"""CUDA graph capture with Python's cyclic collector off.

`torch.cuda.graph` collects on entry, but the capture's own allocations can set off
another collection inside it, and that runs the finalizers of whatever became garbage
before on the capturing thread. Their CUDA calls (a tensor's free recording its stream,
an event's destruction) invalidated captures: on an H100, workers built one after another
in a process that dropped earlier ones unclosed failed a decode graph's capture in 2 of 6
runs ("operation failed due to a previous error during capture"), none of 10 with the
collector off. Every capture in the product (the decode graphs, the kernel timings that
choose FP8 GEMMs at load) goes through here. Imports torch only.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def capture(graph: torch.cuda.CUDAGraph, **options: Any) -> Iterator[None]:
    """`torch.cuda.graph(graph, **options)` with no collection inside."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, **options):
            yield
    finally:
        if collecting:
            gc.enable()

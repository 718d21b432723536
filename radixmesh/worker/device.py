"""Which device and dtype a worker runs on, and what suits them by default."""

from __future__ import annotations

import ctypes
import os

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


MODULE_LOADING = "CUDA_MODULE_LOADING"


def load_cuda_modules_eagerly() -> bool:
    """Have CUDA load every kernel of a library when it loads the library, not at the
    kernel's first launch, unless the process said otherwise (CUDA_MODULE_LOADING set)
    or CUDA already started in it (too late then). Returns whether it was set.

    Why: a kernel loaded at its first launch costs that launch milliseconds, and a
    worker's first batch after start launches hundreds of cuBLAS and torch kernels for
    the first time (shapes the warm-up did not reach). On one H100, FP8 W+KV, 1,024
    requests of 128/128 (`bench/cold_start.py --module-loading lazy,eager`): the first
    batch took 2.85 s more than the same batch warm with lazy loading (torch's
    default), 1.34 s more with eager loading. The price is GPU memory for the kernels
    loaded up front: 1.5% fewer KV pool tokens there (924,681 against 938,899), and no
    longer start. `CUDA_MODULE_LOADING=LAZY` in the environment keeps torch's default.
    Set here, before torch starts CUDA (torch sets LAZY itself when the variable is
    unset); tensor-parallel ranks inherit it."""
    if MODULE_LOADING in os.environ or torch.cuda.is_initialized():
        return False
    os.environ[MODULE_LOADING] = "EAGER"
    return True


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto`: bf16 on CUDA, float32 on CPU.

    On CPU, bf16 would be faster where the CPU multiplies bf16 natively (about 1.4x end to
    end on the Zen 4 test machine) but its logits are coarse (a bf16 step is 0.06-0.125 at
    logit magnitudes 8-32), so a cache hit, which recomputes only the last prompt token in
    a different batch shape, can flip a near-tie and change a greedy answer. float32 keeps
    the radix cache exact: cache on or off, the same greedy tokens. Ask for
    dtype="bfloat16" to trade that for speed.
    """
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def keep_freed_memory_in_process() -> None:
    """Stop glibc from returning large freed blocks to the OS after every step.

    Each step allocates the same large temporaries (activations, logits). By default
    glibc serves blocks over 128 KiB with mmap and unmaps them on free, so every step
    page-faults them in again: measured ~87k faults and ~170 ms of a 900 ms prefill on
    CPU. Raising the mmap threshold to its maximum (32 MiB) and the trim threshold keeps
    them in the heap. No-op where glibc's mallopt is missing.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
        libc.mallopt(m_trim_threshold, 1024 * 1024 * 1024)
    except (OSError, AttributeError):
        pass

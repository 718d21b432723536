"""Which attention backend a worker runs (`EngineConfig.attention_backend`).

- `auto`: the default for the device (`default_attention_backend`).
- `torch`, `triton`: as named.
- `flashinfer`: FlashInfer's kernels (flashinfer_backend.py). What cannot run here — the
  package is missing, or there is no CUDA device — falls back to the device's default and
  says why once in the log, so one config serves GPU and CPU machines alike. What the
  backend cannot serve by design (an FP8 KV cache, float32, deterministic mode) is a
  ValueError naming the setting: those are choices the user made, not machine facts.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

FLASHINFER_DTYPES = (torch.float16, torch.bfloat16)
_warned: set[str] = set()


class FlashInferUnavailable(RuntimeError):
    """FlashInfer cannot run here; the message says why."""


def default_attention_backend(device: torch.device) -> str:
    """Triton kernels on CUDA when triton is installed; the torch reference otherwise."""
    if device.type == "cuda" and importlib.util.find_spec("triton") is not None:
        return "triton"
    return "torch"


def import_flashinfer() -> Any:
    """The flashinfer module, or FlashInferUnavailable naming the reason."""
    try:
        import flashinfer
    except ImportError as e:
        raise FlashInferUnavailable(
            f"flashinfer is not installed ({e}); pip install 'radixmesh[flashinfer]'"
        ) from e
    return flashinfer


def check_flashinfer_supported(kv_dtype: torch.dtype, deterministic: bool) -> None:
    """ValueError naming the setting the flashinfer backend cannot serve."""
    if kv_dtype == torch.float8_e4m3fn:
        raise ValueError(
            "attention_backend: 'flashinfer' cannot read the FP8 KV cache (kv_cache_dtype="
            "'fp8' keeps a scale per token and head; FlashInfer takes one per tensor); "
            "use attention_backend='triton'"
        )
    if kv_dtype not in FLASHINFER_DTYPES:
        raise ValueError(
            f"attention_backend: 'flashinfer' has no {kv_dtype} kernels (float16 and "
            "bfloat16 only); use dtype='bfloat16' or attention_backend='triton'"
        )
    if deterministic:
        raise ValueError(
            "attention_backend: 'flashinfer' is not batch-invariant (its split-KV sums "
            "depend on the batch); deterministic mode needs attention_backend='triton'"
        )


def flashinfer_unavailable_reason(device: torch.device) -> str | None:
    """Why FlashInfer cannot run on `device` here, or None when it can."""
    if device.type != "cuda":
        return f"the flashinfer backend needs a CUDA device, not {device}"
    try:
        import_flashinfer()
    except FlashInferUnavailable as e:
        return str(e)
    return None


def resolve_attention_backend(
    name: str, device: torch.device, kv_dtype: torch.dtype, *, deterministic: bool
) -> str:
    """The backend to build for `name` on `device` with a pool of `kv_dtype`."""
    if name == "auto":
        return default_attention_backend(device)
    if name != "flashinfer":
        return name
    reason = flashinfer_unavailable_reason(device)
    if reason is not None:
        fallback = default_attention_backend(device)
        if reason not in _warned:
            _warned.add(reason)
            logger.warning("%s; using the %s attention backend", reason, fallback)
        return fallback
    check_flashinfer_supported(kv_dtype, deterministic)
    return name

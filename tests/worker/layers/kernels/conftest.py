from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _interpreter_rounds_bf16_to_nearest_even(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's interpreter truncates float32 -> bfloat16 (`x.to(tl.bfloat16)`), where the
    GPU rounds to nearest even as PyTorch does. Round as the GPU does, so that the tests
    can compare bfloat16 results exactly where the kernels' math is PyTorch's."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import triton.language as tl
    from triton.runtime import interpreter

    truncating = interpreter._convert_float

    def convert(data: np.ndarray, src: Any, dst: Any, rounding_mode: Any) -> np.ndarray:
        if src == tl.float32 and dst == tl.bfloat16:
            f32 = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))
            return (
                f32.to(torch.bfloat16)
                .view(torch.int16)
                .numpy()
                .view(np.uint16)
                .reshape(np.shape(data))
            )
        return truncating(data, src, dst, rounding_mode)

    monkeypatch.setattr(interpreter, "_convert_float", convert)

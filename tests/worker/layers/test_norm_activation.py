"""RMSNorm and SiluAndMul against transformers' Llama modules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from radixmesh.worker.layers.activation import SiluAndMul
from radixmesh.worker.layers.norm import RMSNorm


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 0.0), (torch.bfloat16, 1.6e-2)])
def test_rms_norm_matches_transformers(dtype: torch.dtype, atol: float) -> None:
    x, w = torch.randn(7, 96, dtype=dtype), 1 + 0.3 * torch.randn(96, dtype=dtype)
    ours, ref = RMSNorm(96, 1e-5, dtype=dtype), LlamaRMSNorm(96, 1e-5).to(dtype)
    with torch.no_grad():
        ours.weight.copy_(w)
        ref.weight.copy_(w)
    got, want = ours(x), ref(x)
    assert got.dtype == dtype
    # bfloat16: the reference rounds before the weight multiply; one ulp apart at most.
    torch.testing.assert_close(got, want, atol=atol, rtol=atol)


def test_silu_and_mul() -> None:
    gate_up = torch.randn(5, 16)
    torch.testing.assert_close(SiluAndMul()(gate_up), F.silu(gate_up[:, :8]) * gate_up[:, 8:])

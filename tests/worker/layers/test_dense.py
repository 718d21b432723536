from __future__ import annotations

import pytest
import torch

from radixmesh.worker.layers.dense import onednn_packing_available, pack_model_for_cpu
from radixmesh.worker.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from radixmesh.worker.layers.linear import ColumnParallelLinear, RowParallelLinear

pytestmark = pytest.mark.skipif(not onednn_packing_available(), reason="no oneDNN")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_packed_layers_compute_what_plain_ones_do(dtype: torch.dtype, rows: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {
            "col": ColumnParallelLinear(48, 80, bias=True, dtype=dtype),
            "row": RowParallelLinear(80, 48, bias=False, dtype=dtype),
        }
    )
    for p in model.parameters():
        p.data.normal_()
    x = torch.randn(rows, 48, dtype=dtype)
    ref = model["row"](model["col"](x))
    if not onednn_packing_available(dtype):  # bf16 on a CPU without AVX-512: left plain
        assert pack_model_for_cpu(model) == 0
        assert torch.equal(model["row"](model["col"](x)), ref)
        return
    assert pack_model_for_cpu(model) == 2
    col = model["col"]
    assert isinstance(col, ColumnParallelLinear)
    assert col.weight.numel() == 0  # the plain copy is released
    got = model["row"](model["col"](x))
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_a_tied_lm_head_keeps_the_shared_weight() -> None:
    emb = VocabParallelEmbedding(100, 16)
    head = ParallelLMHead(100, 16)
    head.weight = emb.weight
    emb.weight.data.normal_()
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    h = torch.randn(3, 16)
    ref = head(h)
    assert pack_model_for_cpu(model) == 1
    assert emb.weight.numel() == 100 * 16  # still needed for lookups
    torch.testing.assert_close(head(h), ref)

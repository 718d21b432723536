"""Decode CUDA graphs: the batch-size ladder (CPU) and, on CUDA, graph replay against eager
steps on the same engine model (identical greedy tokens in float32)."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.engine import Engine
from radixmesh.worker.model.llama import LlamaDecoderLayer


def test_ladder() -> None:
    from radixmesh.worker.cuda_graph import batch_size_ladder

    assert batch_size_ladder(1) == [1]
    assert batch_size_ladder(8) == [1, 2, 4, 8]
    assert batch_size_ladder(40) == [1, 2, 4, 8, 16, 32, 40]
    assert batch_size_ladder(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    with pytest.raises(ValueError, match="max_batch_size"):
        batch_size_ladder(0)


def test_static_inputs_take_a_decode_batch_and_its_padding() -> None:
    from radixmesh.worker.cuda_graph import fill_static_inputs
    from radixmesh.worker.forward_batch import ForwardBatch

    def batch(on_host: bool) -> ForwardBatch:
        fb = ForwardBatch.build(
            input_ids=[11, 12, 13],
            out_cache_loc=torch.tensor([7, 8, 9]),
            req_rows=[2, 0, 3],
            prefix_lens=[5, 9, 1],
            extend_lens=[1, 1, 1],
            req_to_token=torch.zeros(4, 16, dtype=torch.int64),
            pack_slots=on_host,  # else as from slots already on the device: a copy a field
        )
        assert (fb.decode_inputs is not None) == on_host
        return fb

    padding = torch.zeros(5, 6, dtype=torch.int64)
    padding[4] = 1
    want = [
        [7, 8, 9, 0, -1, -1],
        [11, 12, 13, 0, -1, -1],
        [5, 9, 1, 0, -1, -1],
        [2, 0, 3, 0, -1, -1],
        [6, 10, 2, 1, -1, -1],
    ]
    for on_host in (True, False):
        static = torch.full((5, 6), -1, dtype=torch.int64)
        fill_static_inputs(static, padding, batch(on_host), 4)
        assert static.tolist() == want


def test_config_rejects_negative_max_batch_size() -> None:
    with pytest.raises(ValueError, match="cuda_graph_max_batch_size"):
        Engine("dummy:tiny", device="cpu", cuda_graph_max_batch_size=-1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    ("model", "fp8"),
    [
        ("dummy:tiny", {}),
        ("dummy:tiny", {"quantization": "fp8", "kv_cache_dtype": "fp8"}),
        ("dummy:tiny-moe", {}),  # the sparse layers' grouped GEMMs captured
        ("dummy:tiny-moe", {"quantization": "fp8"}),  # ... with FP8 experts
    ],
    ids=["16-bit", "fp8", "moe", "moe-fp8"],
)
def test_graph_replay_matches_eager_decode(model: str, fp8: dict[str, str]) -> None:
    prompts = [[(7 * i + j) % 500 + 3 for j in range(5 + 9 * i)] for i in range(11)]
    # Different lengths: the decode batch shrinks 11 -> 1, padded to 16, 8, 4, 2, 1.
    params = [
        {"temperature": 0.0, "max_new_tokens": 4 + 3 * i, "ignore_eos": True} for i in range(11)
    ]
    outs = {}
    for graphs in (True, False):
        eng = Engine(
            model,
            device="cuda",
            dtype="float32",
            attention_backend="triton",
            cuda_graph_max_batch_size=32 if graphs else 0,
            kv_cache_tokens=4096,
            max_running_requests=32,
            **fp8,  # float32: FP8 weights by dequantize-then-matmul, the FP8 KV kernels
        )
        runner = eng.worker.runner
        assert (runner.decode_graphs is not None) == graphs
        res = eng.generate(input_ids=prompts, sampling_params=params)
        assert isinstance(res, list)
        outs[graphs] = [r["output_ids"] for r in res]
        if runner.decode_graphs is not None:
            assert runner.decode_graphs.ladder == [1, 2, 4, 8, 16, 32]
            assert runner.decode_graphs.num_replays >= 30  # every decode step replayed
        eng.shutdown()
    assert [len(o) for o in outs[True]] == [4 + 3 * i for i in range(11)]
    assert outs[True] == outs[False]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bf16_fp8_engine_replays_graphs_over_scaled_mm() -> None:
    """bfloat16 with FP8 weights (torch._scaled_mm, per-token activation scales computed on
    the device) and an FP8 KV pool: the decode graphs capture and replay it."""
    from radixmesh.worker.layers.quantization.fp8 import scaled_mm_applies
    from tests.worker.conftest import assert_engine_idle_and_clean

    prompts = [[(7 * i + j) % 500 + 3 for j in range(5 + 9 * i)] for i in range(6)]
    params = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
    with Engine(
        "dummy:tiny",
        device="cuda",
        dtype="bfloat16",
        quantization="fp8",
        kv_cache_dtype="fp8",
        cuda_graph_max_batch_size=8,
        kv_cache_tokens=4096,
        max_running_requests=8,
    ) as eng:
        layer = eng.worker.model.model.layers[0]
        assert isinstance(layer, LlamaDecoderLayer)
        qkv = layer.self_attn.qkv_proj
        assert qkv.weight.dtype == torch.float8_e4m3fn
        x = torch.zeros(1, qkv.weight.shape[1], dtype=torch.bfloat16, device="cuda")
        assert scaled_mm_applies(x, qkv.weight)
        res = eng.generate(input_ids=prompts, sampling_params=params)
        assert isinstance(res, list) and [len(r["output_ids"]) for r in res] == [12] * 6
        graphs = eng.worker.runner.decode_graphs
        assert graphs is not None and graphs.num_replays >= 11
        assert_engine_idle_and_clean(eng)

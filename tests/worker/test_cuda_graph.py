"""Decode CUDA graphs: the batch-size ladder (CPU) and, on CUDA, graph replay against eager
steps on the same engine model (identical greedy tokens in float32)."""

from __future__ import annotations

import pytest
import torch

from radixmesh.worker.engine import Engine


def test_ladder() -> None:
    from radixmesh.worker.cuda_graph import batch_size_ladder

    assert batch_size_ladder(1) == [1]
    assert batch_size_ladder(8) == [1, 2, 4, 8]
    assert batch_size_ladder(40) == [1, 2, 4, 8, 16, 32, 40]
    assert batch_size_ladder(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    with pytest.raises(ValueError, match="max_batch_size"):
        batch_size_ladder(0)


def test_config_rejects_negative_max_batch_size() -> None:
    with pytest.raises(ValueError, match="cuda_graph_max_batch_size"):
        Engine("dummy:tiny", device="cpu", cuda_graph_max_batch_size=-1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_replay_matches_eager_decode() -> None:
    prompts = [[(7 * i + j) % 500 + 3 for j in range(5 + 9 * i)] for i in range(11)]
    # Different lengths: the decode batch shrinks 11 -> 1, padded to 16, 8, 4, 2, 1.
    params = [
        {"temperature": 0.0, "max_new_tokens": 4 + 3 * i, "ignore_eos": True} for i in range(11)
    ]
    outs = {}
    for graphs in (True, False):
        eng = Engine(
            "dummy:tiny",
            device="cuda",
            dtype="float32",
            attention_backend="triton",
            cuda_graph_max_batch_size=32 if graphs else 0,
            kv_cache_tokens=4096,
            max_running_requests=32,
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

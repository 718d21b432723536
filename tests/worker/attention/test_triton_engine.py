"""The engine with triton attention (interpreter on CPU) gives the torch backend's greedy
tokens on a dummy model: prompts long enough for chunked prefill, so steps mix extend and
decode rows, and a shared prefix served from the radix cache; with a 16-bit pool and with an
FP8 one."""

from __future__ import annotations

import pytest
import torch
import triton  # noqa: F401  (a dev dependency: missing must fail, not skip)

from radixmesh.worker.attention.triton_backend import TritonAttentionBackend
from radixmesh.worker.engine import Engine
from tests.worker.conftest import assert_engine_idle_and_clean


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_greedy_tokens_match_torch_backend(kv_cache_dtype: str) -> None:
    shared = [(11 * j) % 480 + 20 for j in range(40)]
    prompts = [shared + [(5 * i + j) % 480 + 20 for j in range(3 + 7 * i)] for i in range(5)]
    prompts.append([7, 8, 9])
    params = {"temperature": 0.0, "max_new_tokens": 6, "ignore_eos": True}
    outs = {}
    for backend in ("triton", "torch"):
        eng = Engine(
            "dummy:tiny",
            device="cpu",
            dtype="float32",
            attention_backend=backend,
            kv_cache_tokens=2048,
            max_num_batched_tokens=64,  # chunked prefill: extend and decode rows in one step
            kv_cache_dtype=kv_cache_dtype,
        )
        assert type(eng.worker.runner.attn).__name__.lower().startswith(backend)
        first = eng.generate(input_ids=prompts[:1], sampling_params=params)
        rest = eng.generate(input_ids=prompts[1:], sampling_params=params)  # prefix cached
        assert isinstance(first, list) and isinstance(rest, list)
        assert rest[0]["meta_info"]["cached_tokens"] >= 40
        outs[backend] = [r["output_ids"] for r in first + rest]
        eng.shutdown()
    assert all(len(o) == 6 for o in outs["triton"])
    assert outs["triton"] == outs["torch"]


@pytest.mark.parametrize("fused", ["0", "1"], ids=["split", "fused"])
def test_shared_prefix_decode_gives_the_torch_backends_tokens(
    monkeypatch: pytest.MonkeyPatch, fused: str
) -> None:
    """Nine requests decoding behind one cached 48-token prefix: with the shared-prefix
    decode on (`shared_prefix_decode`), their decode steps read it once
    (kernels/decode_shared.py), and the greedy tokens are the torch backend's."""
    shared = [(13 * j) % 480 + 20 for j in range(48)]
    prompts = [shared + [(7 * i + j) % 480 + 20 for j in range(2 + i)] for i in range(9)]
    params = {"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True}
    outs = {}
    monkeypatch.delenv("RADIXMESH_SHARED_PREFIX_DECODE", raising=False)
    monkeypatch.setenv("RADIXMESH_SHARED_PREFIX_FUSED", fused)  # the one-launch kernel
    for backend in ("triton", "torch"):
        eng = Engine(
            "dummy:tiny", device="cpu", dtype="float32", attention_backend=backend,
            kv_cache_tokens=2048, shared_prefix_decode=backend == "triton",
        )  # fmt: skip
        eng.generate(input_ids=prompts[:1], sampling_params=params)  # the prefix cached
        out = eng.generate(input_ids=prompts, sampling_params=params)
        assert isinstance(out, list)
        outs[backend] = [r["output_ids"] for r in out]
        attn = eng.worker.runner.attn
        if backend == "triton":
            assert isinstance(attn, TritonAttentionBackend)
            assert attn.num_shared_prefix_steps >= 1
        eng.shutdown()
    assert outs["triton"] == outs["torch"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_shared_prefix_decode_graphs_give_the_flat_graphs_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On CUDA, with the shared-prefix decode on, the decode graphs of 8 rows or more are
    captured with its launches: 24 requests behind one cached 300-token prefix, plus 4
    of their own (the first shares only its first token with the others, as a chat
    template's would: the 24 still group over their 300), decode through those graphs
    (replays, shared steps counted, no eager shared step), and the greedy tokens (float32)
    are those of the flat graphs; every slot is free or cached after."""
    shared = [(13 * j) % 900 + 20 for j in range(300)]
    prompts = [shared + [(7 * i + j) % 900 + 20 for j in range(3 + 5 * i)] for i in range(24)]
    prompts += [[(11 * i + j) % 900 + 20 for j in range(40 + i)] for i in range(4)]
    params = [
        {"temperature": 0.0, "max_new_tokens": 6 + i % 5, "ignore_eos": True} for i in range(28)
    ]
    outs = {}
    monkeypatch.delenv("RADIXMESH_SHARED_PREFIX_DECODE", raising=False)
    for on in ("0", "1"):
        with Engine(
            "dummy:llama-3-8b@layers=2", device="cuda", dtype="float32",
            attention_backend="triton", cuda_graph_max_batch_size=32, kv_cache_tokens=16384,
            max_running_requests=32, shared_prefix_decode=on == "1",
        ) as eng:  # fmt: skip
            runner = eng.worker.runner
            attn = runner.attn
            assert isinstance(attn, TritonAttentionBackend) and runner.decode_graphs is not None

            def eager(*_: object) -> bool:
                raise AssertionError("a shared-prefix step ran eagerly")

            monkeypatch.setattr(attn, "_shared_chunks", eager)
            eng.generate(input_ids=[*shared, 7], sampling_params={"max_new_tokens": 1})
            res = eng.generate(input_ids=prompts, sampling_params=params)
            assert isinstance(res, list)
            outs[on] = [r["output_ids"] for r in res]
            assert runner.decode_graphs.num_replays >= 5
            if on == "1":
                assert attn.num_shared_prefix_steps >= 5
            else:
                assert attn.num_shared_prefix_steps == 0
            assert_engine_idle_and_clean(eng)
    assert [len(o) for o in outs["1"]] == [6 + i % 5 for i in range(28)]
    assert outs["1"] == outs["0"]

"""Batch sizes left unset are filled in for the device (worker/config.py); the FP8
options (quantization, kv_cache_dtype) from the CLI to a running engine."""

from __future__ import annotations

import pytest
import torch

from radixmesh.cluster.cli import build_parser, engine_options
from radixmesh.errors import InvalidArgument
from radixmesh.worker.config import (
    EngineConfig,
    SchedulerConfig,
    batch_defaults,
    fit_running_to_pool,
)
from radixmesh.worker.engine import Engine
from radixmesh.worker.model.llama import LlamaDecoderLayer
from tests.worker.conftest import assert_engine_idle_and_clean

GIB = 1 << 30


def test_cpu_defaults() -> None:
    sc = batch_defaults(SchedulerConfig(), "cpu")
    assert (sc.max_running_requests, sc.max_num_batched_tokens) == (64, 2048)


def test_cuda_defaults_follow_the_gpu() -> None:
    # The running cap is the most it may be until the pool is known (fit_running_to_pool).
    big = batch_defaults(SchedulerConfig(), "cuda", 141 * GIB)
    assert (big.max_running_requests, big.max_num_batched_tokens) == (1024, 8192)
    small = batch_defaults(SchedulerConfig(), "cuda", 24 * GIB)
    assert (small.max_running_requests, small.max_num_batched_tokens) == (1024, 4096)


def test_cuda_running_cap_follows_the_pool() -> None:
    sc = batch_defaults(SchedulerConfig(), "cuda", 141 * GIB)
    # Llama-3-8B on an H200: a bf16 pool, then an FP8 one (about twice the tokens).
    assert fit_running_to_pool(sc, 897_413).max_running_requests == 876  # 897,413 / 1,024
    assert fit_running_to_pool(sc, 1_776_000).max_running_requests == 1024  # the ceiling
    assert fit_running_to_pool(sc, 64_000).max_running_requests == 62
    assert fit_running_to_pool(sc, 1_000).max_running_requests == 16  # the floor


def test_overlap_is_on_for_cuda_only_unless_given() -> None:
    assert batch_defaults(SchedulerConfig(), "cpu").overlap_schedule is False
    assert batch_defaults(SchedulerConfig(), "cuda", 141 * GIB).overlap_schedule is True
    on = SchedulerConfig(overlap_schedule=True)
    assert batch_defaults(on, "cpu").overlap_schedule is True


def test_given_sizes_are_kept() -> None:
    sc = SchedulerConfig(max_running_requests=8, max_num_batched_tokens=100, overlap_schedule=False)
    assert batch_defaults(sc, "cuda", 141 * GIB) == sc
    with pytest.raises(InvalidArgument, match="max_running_requests"):
        SchedulerConfig(max_running_requests=0)


def test_the_engine_reports_its_resolved_sizes() -> None:
    with Engine("dummy:tiny", device="cpu") as engine:
        sc = engine.config.scheduler
        assert (sc.max_running_requests, sc.max_num_batched_tokens) == (64, 2048)
        assert sc.overlap_schedule is False
        assert engine.worker.req_table.num_free_rows == 64


def test_fp8_options_from_the_command_line() -> None:
    args = build_parser().parse_args(
        ["worker", "--model", "dummy:tiny", "--quantization", "fp8", "--kv-cache-dtype", "fp8"]
    )
    cfg = EngineConfig.from_options(**engine_options(args))
    assert cfg.model.quantization == "fp8" and cfg.cache.kv_cache_dtype == "fp8"
    default = EngineConfig.from_options(**engine_options(build_parser().parse_args(["worker"])))
    assert default.model.quantization is None and default.cache.kv_cache_dtype == "auto"


@pytest.mark.parametrize(
    ("option", "value"),
    [("quantization", "int4"), ("kv_cache_dtype", "fp16"), ("quantization", "")],
)
def test_bad_fp8_option_values_name_the_field(option: str, value: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        EngineConfig.from_options(**{option: value})
    assert err.value.field == option


def test_engine_with_fp8_weights_and_kv_serves_and_accounts_for_every_slot() -> None:
    """dummy:tiny end to end: FP8 linear weights (at every step, or dequantized once as a
    CPU worker does) and an FP8 KV pool give the same greedy tokens; no slot leaks."""
    prompts = [[5, 6, 7, 8], [5, 6, 7, 9, 10, 11], [300, 2, 17]]
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    outputs = []
    for pack in (False, True):
        with Engine(
            "dummy:tiny",
            dtype="float32",
            quantization="fp8",
            kv_cache_dtype="fp8",
            pack_cpu_weights=pack,
            kv_cache_tokens=256,
        ) as engine:
            layer = engine.worker.model.model.layers[0]
            assert isinstance(layer, LlamaDecoderLayer)
            qkv = layer.self_attn.qkv_proj
            assert qkv.weight.dtype == (torch.float32 if pack else torch.float8_e4m3fn)
            assert engine.worker.kv_pool.dtype == torch.float8_e4m3fn
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            assert isinstance(outs, list)
            outputs.append([o["output_ids"] for o in outs])
            assert_engine_idle_and_clean(engine)
    assert outputs[0] == outputs[1]
    assert all(len(ids) == 12 for ids in outputs[0])

"""Which attention backend a worker builds: `auto` per device, FlashInfer's absence handled
by falling back (said once), and the settings FlashInfer cannot serve refused by name."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from radixmesh.worker.attention import selection
from radixmesh.worker.attention.registry import (
    available_attention_backends,
    create_attention_backend,
)
from radixmesh.worker.attention.selection import (
    check_flashinfer_supported,
    default_attention_backend,
    resolve_attention_backend,
)
from radixmesh.worker.kvcache.pool import KVPool

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
BF16 = torch.bfloat16


@pytest.fixture
def no_flashinfer(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import flashinfer` fails, as where the package is not installed."""
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    monkeypatch.setattr(selection, "_warned", set())


def test_auto_picks_triton_on_cuda_only() -> None:
    assert default_attention_backend(CPU) == "torch"
    assert default_attention_backend(CUDA) == "triton"
    assert resolve_attention_backend("auto", CPU, torch.float32, deterministic=False) == "torch"
    assert resolve_attention_backend("auto", CUDA, BF16, deterministic=True) == "triton"


def test_named_backends_pass_through() -> None:
    assert "flashinfer" in available_attention_backends()
    for name in ("torch", "triton"):
        assert resolve_attention_backend(name, CPU, torch.float32, deterministic=True) == name


def test_missing_flashinfer_falls_back_and_says_why_once(
    no_flashinfer: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=selection.__name__):
        for _ in range(3):
            got = resolve_attention_backend("flashinfer", CUDA, BF16, deterministic=False)
            assert got == "triton"
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "flashinfer is not installed" in warnings[0]
    assert "radixmesh[flashinfer]" in warnings[0]
    assert "using the triton attention backend" in warnings[0]


def test_cpu_falls_back_to_torch(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(selection, "_warned", set())
    with caplog.at_level(logging.WARNING, logger=selection.__name__):
        got = resolve_attention_backend("flashinfer", CPU, torch.float32, deterministic=True)
    assert got == "torch"
    assert [r.getMessage() for r in caplog.records] == [
        "the flashinfer backend needs a CUDA device, not cpu; using the torch attention backend"
    ]


@pytest.mark.parametrize(
    ("dtype", "deterministic", "match"),
    [
        (torch.float8_e4m3fn, False, "kv_cache_dtype='fp8'"),
        (torch.float32, False, "float32"),
        (BF16, True, "deterministic mode"),
    ],
    ids=["fp8-kv", "float32", "deterministic"],
)
def test_what_flashinfer_cannot_serve_is_refused_by_name(
    dtype: torch.dtype, deterministic: bool, match: str
) -> None:
    with pytest.raises(ValueError, match=f"attention_backend: 'flashinfer'.*{match}"):
        check_flashinfer_supported(dtype, deterministic)
    check_flashinfer_supported(torch.float16, False)
    check_flashinfer_supported(BF16, False)


def test_building_it_on_cpu_names_the_field() -> None:
    pool = KVPool(num_slots=4, num_layers=1, num_kv_heads=1, head_dim=16, dtype=torch.float32,
                  device="cpu")  # fmt: skip
    with pytest.raises(ValueError, match=r"attention_backend: .*needs a CUDA device"):
        create_attention_backend("flashinfer", pool, 0.25)


def test_engine_on_cpu_serves_with_the_fallback() -> None:
    from radixmesh.worker.engine import Engine

    with Engine("dummy:tiny", device="cpu", attention_backend="flashinfer") as eng:
        assert eng.worker.attention_backend == "torch"
        out = eng.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 3,
                                                                 "ignore_eos": True})  # fmt: skip
        assert isinstance(out, dict) and len(out["output_ids"]) == 3

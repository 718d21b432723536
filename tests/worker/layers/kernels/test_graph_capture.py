"""graph_capture.capture: the collector is off exactly while a graph is captured, and
back as it was after, also when the capture fails (torch.cuda.graph stood in for, so
this runs without CUDA; the captures themselves run in the GPU tests)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from radixmesh.worker.layers.kernels import graph_capture


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, dict[str, Any]]]:
    """What the stand-in for torch.cuda.graph saw: the collector's state, its options."""
    calls: list[tuple[bool, dict[str, Any]]] = []

    @contextmanager
    def graph(g: object, **options: Any) -> Iterator[None]:
        calls.append((gc.isenabled(), options))
        yield

    monkeypatch.setattr(torch.cuda, "graph", graph)
    return calls


def test_the_collector_is_off_inside_and_back_after(
    seen: list[tuple[bool, dict[str, Any]]],
) -> None:
    assert gc.isenabled()
    with graph_capture.capture(object(), pool=7, capture_error_mode="thread_local"):  # type: ignore[arg-type]
        assert not gc.isenabled()
    assert gc.isenabled()
    assert seen == [(False, {"pool": 7, "capture_error_mode": "thread_local"})]


def test_back_after_a_failed_capture_and_left_off_if_it_was(
    seen: list[tuple[bool, dict[str, Any]]],
) -> None:
    with (
        pytest.raises(RuntimeError, match="capture failed"),
        graph_capture.capture(object()),  # type: ignore[arg-type]
    ):
        raise RuntimeError("capture failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with graph_capture.capture(object()):  # type: ignore[arg-type]
            pass
        assert not gc.isenabled()  # a caller's own choice is kept
    finally:
        gc.enable()
    assert [on for on, _ in seen] == [False, False]

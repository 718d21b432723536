"""worker/device.py: the CUDA module loading a worker asks for."""

from __future__ import annotations

import os

import pytest
import torch

from radixmesh.worker import device


def test_eager_module_loading_is_set_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(device.MODULE_LOADING, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert device.load_cuda_modules_eagerly() is True

    assert os.environ[device.MODULE_LOADING] == "EAGER"


def test_a_chosen_module_loading_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(device.MODULE_LOADING, "LAZY")
    assert device.load_cuda_modules_eagerly() is False

    assert os.environ[device.MODULE_LOADING] == "LAZY"


def test_nothing_is_set_once_cuda_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(device.MODULE_LOADING, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert device.load_cuda_modules_eagerly() is False

    assert device.MODULE_LOADING not in os.environ

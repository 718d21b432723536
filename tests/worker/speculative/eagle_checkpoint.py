"""Random EAGLE heads for the dummy:tiny target (speculative/random_head.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from radixmesh.worker.model.arch import PRESETS, LlamaArchConfig
from radixmesh.worker.speculative import random_head
from radixmesh.worker.speculative.random_head import random_head_weights

TINY = PRESETS["tiny"]  # the dummy:tiny target's shapes

__all__ = ["TINY", "head_arch", "random_head_weights", "write_head"]


def head_arch(target: LlamaArchConfig = TINY, **changes: Any) -> LlamaArchConfig:
    return random_head.head_arch(target, **changes)


def write_head(
    path: Path,
    arch: LlamaArchConfig = TINY,
    weights: dict[str, torch.Tensor] | None = None,
    seed: int = 0,
) -> Path:
    return random_head.write_head(path, arch, weights, seed)

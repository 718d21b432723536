"""EngineInfo: what a worker serves, as its server tells clients (GetModelInfo)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineInfo:
    model: str
    context_len: int
    vocab_size: int
    eos_ids: frozenset[int]
    bos_token_id: int | None

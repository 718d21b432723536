"""EngineInfo: what a worker serves, as its server tells clients (GetModelInfo)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineInfo:
    model: str  # the model option as given
    served_model: str  # the name clients use (--served-model-name, else the model)
    tokenizer_spec: str  # where the tokenizer's files are (a hub id pinned to a commit)
    chat_template: str  # the template in use ("": the tokenizer has none of its own)
    context_len: int
    vocab_size: int
    eos_ids: frozenset[int]
    bos_token_id: int | None
    hidden_size: int  # the width of the final hidden states (an embedding's length)
    # Batch-invariant numerics (ModelConfig.deterministic); GetLoad's trailing metadata
    # tells the router (wire.DETERMINISTIC_METADATA_KEY).
    deterministic: bool = False

"""A model whose attention slides over a window (Mistral 7B v0.1's 4,096 tokens) is served
with its context capped at the window, where full attention is the window's: a tiny
Mistral saved as a Hugging Face directory, served by the Engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from radixmesh.errors import InvalidArgument
from radixmesh.worker.engine import Engine
from tests.worker.model.helpers import SMALL, write_tokenizer

WINDOW = 48


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mistral")
    settings: dict[str, Any] = {**SMALL, "sliding_window": WINDOW}
    config = transformers.MistralConfig(**settings)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    write_tokenizer(path, SMALL["vocab_size"])
    return path


def test_the_context_is_the_window(mistral_dir: Path) -> None:
    engine = Engine(str(mistral_dir), dtype="float32", kv_cache_tokens=512)
    try:
        assert engine.worker.context_len == WINDOW
        params = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
        out = engine.generate(input_ids=list(range(3, 3 + WINDOW - 4)), sampling_params=params)
        assert isinstance(out, dict) and len(out["output_ids"]) == 4
        with pytest.raises(InvalidArgument) as e:
            engine.generate(input_ids=list(range(3, 3 + WINDOW + 1)), sampling_params=params)
        assert e.value.field == "prompt"
    finally:
        engine.shutdown()


def test_a_context_past_the_window_is_refused_by_name(mistral_dir: Path) -> None:
    with pytest.raises(InvalidArgument, match=f"at most {WINDOW}: the model attends") as e:
        Engine(str(mistral_dir), dtype="float32", kv_cache_tokens=512, context_length=64)
    assert e.value.field == "context_length"

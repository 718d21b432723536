"""How long a context a model is served with: a model whose attention slides over a window
(Mistral 7B v0.1's 4,096 tokens) is capped at the window, where full attention is the
window's; `context_length` may not pass the model's positions, unless its rope scaling
(YaRN) stretches them, and then the rotary tables reach it. Tiny models saved as Hugging
Face directories, served by the Engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from radixmesh.errors import InvalidArgument
from radixmesh.worker.engine import Engine
from tests.worker.model.helpers import (
    SMALL,
    YARN_ROPE,
    hf_logits,
    make_pair,
    random_ids,
    write_tokenizer,
)

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


def test_a_context_past_the_models_positions_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument, match="at most 2048: the model's positions") as e:
        Engine("dummy:tiny", context_length=4096)
    assert e.value.field == "context_length"


def test_yarn_stretches_the_context_and_the_rotary_tables_reach_it(tmp_path: Path) -> None:
    """Positions 0..127 in the config, YaRN x4 over an original 64: a context of 200 is
    served, and a 190-token prompt's greedy tokens (past position 128) are transformers'.
    Each step's top two logits differ by far more than the implementations do."""
    hf, _ = make_pair("qwen2-yarn", max_position_embeddings=128)
    assert isinstance(hf, transformers.GenerationMixin)
    hf.save_pretrained(tmp_path)
    write_tokenizer(tmp_path, SMALL["vocab_size"])
    prompt = random_ids(190, seed=4)
    with torch.no_grad():
        ids = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0]
    top2 = hf_logits(hf, ids.tolist())[len(prompt) - 1 : -1].topk(2).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-3
    engine = Engine(str(tmp_path), dtype="float32", kv_cache_tokens=512, context_length=200)
    try:
        assert engine.worker.arch.rope_scaling == {
            k: v for k, v in YARN_ROPE.items() if k != "rope_theta"
        }
        assert engine.worker.context_len == 200
        params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
        out = engine.generate(input_ids=prompt, sampling_params=params)
        assert isinstance(out, dict) and out["output_ids"] == ids[len(prompt) :].tolist()
    finally:
        engine.shutdown()
    with pytest.raises(InvalidArgument, match="at most 256: the model's positions"):
        Engine(str(tmp_path), dtype="float32", kv_cache_tokens=512, context_length=300)

"""The EAGLE head (speculative/eagle_head.py), float32 on the CPU: its forward against
transformers' own LlamaDecoderLayer with the fc in front and an identity input norm; the
incremental KV path against one pass over the whole history; loading a checkpoint
written in the EAGLE layout, and refusing bad ones by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from radixmesh.errors import InvalidArgument
from radixmesh.worker.config import SpeculativeConfig
from radixmesh.worker.speculative.eagle_head import EagleHead, load_eagle_head
from tests.worker.factories import make_worker
from tests.worker.speculative.eagle_checkpoint import (
    TINY,
    head_arch,
    random_head_weights,
    write_head,
)

# float32, O(1) activations, one layer: the two paths differ by summation order only.
ATOL = 1e-5


@pytest.fixture
def head(tmp_path: Path) -> EagleHead:
    return load_eagle_head(write_head(tmp_path / "head"), TINY, torch.float32, "cpu")


def _inputs(t: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, TINY.hidden_size, generator=g), torch.randn(
        t, TINY.hidden_size, generator=g
    )


def _reference(head: EagleHead, embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """fc, then transformers' decoder layer (input norm replaced by identity), causal,
    positions 0 .. T - 1; [T, H]."""
    config = LlamaConfig(**head_arch(TINY).to_hf_dict())
    config._attn_implementation = "eager"
    layer = LlamaDecoderLayer(config, layer_idx=0)
    layer.input_layernorm = nn.Identity()  # type: ignore[assignment]
    state = {
        name.removeprefix("layers.0."): p
        for name, p in head.state_dict().items()
        if name.startswith("layers.0.")
    }
    layer.load_state_dict(state, strict=False)
    missing = set(layer.state_dict()) - set(state)
    assert not missing, missing
    t = embeds.shape[0]
    x = head.fc(torch.cat((embeds, features), dim=-1)).unsqueeze(0)  # [1, T, H]
    positions = torch.arange(t).unsqueeze(0)
    cos_sin = LlamaRotaryEmbedding(config)(x, positions)
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]  # [1, 1, T, T]
    out = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=cos_sin)
    hidden = out[0] if isinstance(out, tuple) else out
    return hidden[0]


@torch.inference_mode()
def test_forward_equals_transformers_layer(head: EagleHead) -> None:
    t = 9
    embeds, features = _inputs(t)
    kv = torch.empty(0, TINY.num_key_value_heads, TINY.head_size)
    h, k, v = head(embeds, features, torch.arange(t), kv, kv)
    want = _reference(head, embeds, features)
    assert h.shape == (t, TINY.hidden_size) and k.shape == v.shape == (t, 2, 16)
    torch.testing.assert_close(h, want, atol=ATOL, rtol=0)
    lm_head = torch.randn(TINY.vocab_size, TINY.hidden_size)  # logits through an lm_head
    torch.testing.assert_close(h @ lm_head.T, want @ lm_head.T, atol=1e-4, rtol=0)


@torch.inference_mode()
def test_incremental_kv_equals_one_pass(head: EagleHead) -> None:
    embeds, features = _inputs(10, seed=2)
    positions = torch.arange(3, 13)  # a history that starts past 0 (a cached prefix)
    kv = torch.empty(0, TINY.num_key_value_heads, TINY.head_size)
    whole, _, _ = head(embeds, features, positions, kv, kv)
    keys, values, parts = kv, kv, []
    for lo, hi in ((0, 4), (4, 5), (5, 6), (6, 10)):
        h, k, v = head(embeds[lo:hi], features[lo:hi], positions[lo:hi], keys, values)
        keys, values = torch.cat((keys, k)), torch.cat((values, v))
        parts.append(h)
    torch.testing.assert_close(torch.cat(parts), whole, atol=ATOL, rtol=0)


def test_checkpoint_loads_with_its_weights(tmp_path: Path) -> None:
    weights = random_head_weights(head_arch(TINY), seed=5)
    path = write_head(tmp_path / "h", weights=weights)
    head = load_eagle_head(path, TINY, torch.float32, "cpu")
    state = head.state_dict()
    assert torch.equal(state["fc.weight"], weights["fc.weight"])
    assert torch.equal(state["fc.bias"], weights["fc.bias"])
    name = "layers.0.mlp.down_proj.weight"
    assert torch.equal(state[name], weights[name])
    assert "embed_tokens.weight" not in state  # the target's embedding is used
    no_bias = {k: v for k, v in weights.items() if k != "fc.bias"}
    head = load_eagle_head(write_head(tmp_path / "nb", weights=no_bias), TINY, torch.float32, "cpu")
    assert head.fc.bias is None


@pytest.mark.parametrize(
    "drop", ["fc.weight", "layers.0.self_attn.k_proj.weight", "layers.0.mlp.up_proj.weight"]
)
def test_missing_weights_are_refused_by_name(tmp_path: Path, drop: str) -> None:
    weights = random_head_weights(head_arch(TINY))
    del weights[drop]
    path = write_head(tmp_path / "h", weights=weights)
    with pytest.raises(InvalidArgument) as e:
        load_eagle_head(path, TINY, torch.float32, "cpu")
    assert e.value.field == "speculative_draft_model" and drop in e.value.message


@pytest.mark.parametrize(
    "changes", [{"hidden_size": 32, "head_dim": 8}, {"vocab_size": 1000}], ids=["hidden", "vocab"]
)
def test_a_head_for_another_model_is_refused(tmp_path: Path, changes: dict[str, int]) -> None:
    path = write_head(tmp_path / "h", arch=TINY.replace(**changes))
    with pytest.raises(InvalidArgument) as e:
        load_eagle_head(path, TINY, torch.float32, "cpu")
    assert e.value.field == "speculative_draft_model"
    assert next(iter(changes)) in e.value.message


def test_bad_directories_and_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as e:
        SpeculativeConfig(speculative="eagle")
    assert e.value.field == "speculative_draft_model"
    with pytest.raises(InvalidArgument) as e:
        load_eagle_head(tmp_path, TINY, torch.float32, "cpu")  # no config.json
    assert e.value.field == "speculative_draft_model"
    write_head(tmp_path / "h")
    (tmp_path / "h" / "model.safetensors").unlink()
    with pytest.raises(InvalidArgument) as e:
        load_eagle_head(tmp_path / "h", TINY, torch.float32, "cpu")
    assert e.value.field == "speculative_draft_model" and "safetensors" in e.value.message
    weights = random_head_weights(head_arch(TINY))
    weights["fc.weight"] = weights["fc.weight"][:, :64].clone()  # [H, H], not [H, 2H]
    save_file(weights, str(tmp_path / "h" / "model.safetensors"))
    with pytest.raises(InvalidArgument) as e:
        load_eagle_head(tmp_path / "h", TINY, torch.float32, "cpu")
    assert "fc.weight" in e.value.message
    good = str(write_head(tmp_path / "good"))
    for bad in ({"deterministic": True}, {"page_size": 4}, {"tp_size": 2}):
        with pytest.raises(InvalidArgument) as e:
            make_worker(speculative="eagle", speculative_draft_model=good, **bad)
        assert e.value.field == "speculative"

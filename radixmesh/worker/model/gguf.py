"""GGUF files (llama.cpp's format), converted once into a cached Hugging Face directory.

Dequantizing a GGUF and building its tokenizer takes seconds to minutes, so the first load
writes config.json, float32 safetensors and tokenizer files under
`$RADIXMESH_CACHE_DIR` (default ~/.cache/radixmesh); later loads read that directory with
the HF loader. The cache key covers the file's path, size and mtime and the converter's
version (`radixmesh.model_source`, where the router finds the tokenizer too), and each
conversion is written to a temporary directory that is renamed into place, so a killed
conversion never leaves a half-written cache.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file
from tqdm import tqdm

from radixmesh.errors import InvalidArgument
from radixmesh.model_source import cache_dir_for, cached_dir  # the cache's location (shared)
from radixmesh.tokenizer import Tokenizer
from radixmesh.worker.model.arch import LlamaArchConfig

SHARD_BYTES = 2 * 1024**3
INDEX_FILE = "model.safetensors.index.json"
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

_LAYER_PARTS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_LEVEL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


# --- metadata ------------------------------------------------------------------------------


def read_arch_config(reader: GGUFReader) -> LlamaArchConfig:
    """The architecture from GGUF metadata (`<arch>.*` keys) and the tensor list."""
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise InvalidArgument(
            "model",
            f"GGUF architecture {arch!r} is not supported; supported: {list(ARCHITECTURES)}",
        )
    tensors = {t.name for t in reader.tensors}
    if "blk.0.ffn_gate_exps.weight" in tensors or "blk.0.ffn_gate_inp.weight" in tensors:
        raise InvalidArgument(
            "model",
            "GGUF mixture-of-experts models are not supported; use the Hugging Face directory",
        )
    if "rope_freqs.weight" in tensors:
        raise InvalidArgument(
            "model",
            "GGUF with a rope_freqs tensor (Llama 3.1 rope scaling) is not supported; "
            "use the Hugging Face directory instead",
        )
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    eos = [_field(reader, f"tokenizer.ggml.{k}_token_id", None) for k in ("eos", "eot", "eom")]
    return LlamaArchConfig(
        vocab_size=_vocab_size(reader),
        hidden_size=hidden,
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
        num_hidden_layers=int(_field(reader, f"{arch}.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, f"{arch}.attention.key_length", hidden // heads)),
        rms_norm_eps=_f32(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=_f32(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(reader, arch),
        max_position_embeddings=int(_field(reader, f"{arch}.context_length", 4096)),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id", None),
        eos_token_ids=tuple(dict.fromkeys(int(e) for e in eos if e is not None)),
        architecture=ARCHITECTURES[arch],
    )


_MISSING = object()


def _field(reader: GGUFReader, key: str, default: Any = _MISSING) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise InvalidArgument("model", f"GGUF metadata lacks {key!r}")
        return default
    return field.contents()


def _vocab_size(reader: GGUFReader) -> int:
    # The embedding's rows, not the token list: models pad their vocabulary past it.
    for t in reader.tensors:
        if t.name == "token_embd.weight":
            return int(t.shape[-1])  # GGUF shapes list the fastest-varying dimension first
    raise InvalidArgument("model", "GGUF has no token_embd.weight tensor")


def _f32(value: float) -> float:
    # GGUF stores float32; its shortest decimal (1e-05, not 9.99999974e-06) is the value the
    # original config.json had.
    return float(str(np.float32(value)))


def _rope_scaling(reader: GGUFReader, arch: str) -> dict[str, Any] | None:
    kind = _field(reader, f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind != "linear":
        raise InvalidArgument("model", f"GGUF rope scaling {kind!r} is not supported")
    return {"rope_type": "linear", "factor": _f32(_field(reader, f"{arch}.rope.scaling.factor"))}


# --- tensors -------------------------------------------------------------------------------


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    base, suffix = gguf_name.rsplit(".", 1)
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        if part in _LAYER_PARTS:
            return f"model.layers.{layer}.{_LAYER_PARTS[part]}.{suffix}"
    elif base in _TOP_LEVEL:
        return f"{_TOP_LEVEL[base]}.{suffix}"
    raise InvalidArgument("model", f"unexpected GGUF tensor {gguf_name!r}")


def unpermute_rotary_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation.

    llama.cpp rotates interleaved pairs (x0, x1), (x2, x3), ..., so its converter reorders
    each head's rows from HF's halves layout [first half | second half] to pairs
    [r0, r_half, r1, r_half+1, ...]. Reading rows as (head, pair, 2) and swapping the last
    two axes restores (head, 2, pair), the layout HF's rotate_half expects.
    """
    rows = w.shape[0]
    pairs = w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
    return pairs.transpose(1, 2).reshape(w.shape).contiguous()


def iter_gguf_tensors(
    reader: GGUFReader, arch: LlamaArchConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, float32 CPU tensor) for every tensor of the file, dequantized."""
    # Qwen2 and Qwen3 GGUFs keep HF's order.
    permuted = _field(reader, "general.architecture") == "llama"
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        w = torch.from_numpy(_writable(dequantize(tensor.data, tensor.tensor_type)))
        w = w.to(torch.float32)
        if permuted and ".q_proj." in name:
            w = unpermute_rotary_rows(w, arch.num_attention_heads)
        elif permuted and ".k_proj." in name:
            w = unpermute_rotary_rows(w, arch.num_key_value_heads)
        yield name, w


def _writable(a: np.ndarray) -> np.ndarray:
    # F32 tensors come back as read-only views of the memory-mapped file, which torch
    # warns about; quantized ones are fresh arrays and need no copy.
    return a if a.flags.writeable and a.flags.c_contiguous else np.array(a, order="C")


# --- the converted cache -------------------------------------------------------------------


def ensure_converted(gguf_path: str | Path) -> Path:
    """The cached HF directory of a GGUF file, converting it first if needed."""
    return cached_dir(gguf_path) or convert(gguf_path, cache_dir_for(gguf_path))


def convert(gguf_path: str | Path, out: Path) -> Path:
    """Write the HF-format conversion of `gguf_path` to `out`, atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        reader = GGUFReader(str(gguf_path))
        arch = read_arch_config(reader)
        tensors = iter_gguf_tensors(reader, arch)
        total = len(reader.tensors)
        # disable=None: a bar on a terminal only (a log file would get every update)
        bar = tqdm(tensors, desc="converting GGUF", unit=" tensors", total=total, disable=None)
        _write_weights(tmp, bar)
        build_tokenizer(gguf_path, arch).hf_tokenizer.save_pretrained(str(tmp))
        (tmp / "radixmesh_source.json").write_text(json.dumps({"gguf": str(gguf_path)}) + "\n")
        # config.json last: its presence marks a complete conversion.
        (tmp / "config.json").write_text(json.dumps(arch.to_hf_dict(), indent=2) + "\n")
        _make_readable(tmp)
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _make_readable(tmp: Path) -> None:
    # mkdtemp creates 0700; a finished cache is as readable as any other cached download.
    tmp.chmod(0o755)
    for f in tmp.iterdir():
        f.chmod(0o644)


def _publish(tmp: Path, out: Path) -> None:
    try:
        os.rename(tmp, out)
    except OSError:
        # Another process (a tensor-parallel peer) finished the same conversion first.
        if not (out / "config.json").is_file():
            raise


def _write_weights(out: Path, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Safetensors shards of at most SHARD_BYTES (bounds the memory a conversion holds)."""
    shard: dict[str, torch.Tensor] = {}
    size = 0
    weight_map: dict[str, str] = {}
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        if shard and size + nbytes > SHARD_BYTES:
            weight_map.update(_save_shard(out, shard, len(set(weight_map.values())) + 1))
            shard, size = {}, 0
        shard[name] = t
        size += nbytes
    if not weight_map:  # one file needs no index
        save_file(shard, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map.update(_save_shard(out, shard, len(set(weight_map.values())) + 1))
    index = {"metadata": {}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def _save_shard(out: Path, tensors: dict[str, torch.Tensor], number: int) -> dict[str, str]:
    name = f"model-{number:05d}.safetensors"
    save_file(tensors, str(out / name), metadata={"format": "pt"})
    return dict.fromkeys(tensors, name)


def build_tokenizer(gguf_path: str | Path, arch: LlamaArchConfig) -> Tokenizer:
    """The tokenizer transformers builds from GGUF metadata (chat template included)."""
    path = Path(gguf_path)
    return Tokenizer.from_pretrained(
        str(path.parent),
        gguf_file=path.name,
        vocab_size=arch.vocab_size,
        eos_token_ids=arch.eos_token_ids,
    )


def read_gguf_arch_config(gguf_path: str | Path) -> LlamaArchConfig:
    path = Path(gguf_path).resolve()
    st = path.stat()
    return _read_arch_config_memo(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_arch_config_memo(path: str, size: int, mtime_ns: int) -> LlamaArchConfig:
    # Parsing the metadata takes seconds (it holds the whole token list), and a worker's
    # first start asks for the architecture more than once before the cache exists.
    return read_arch_config(GGUFReader(path))

"""A model's vocabulary as grammars see it: the bytes each token id stands for.

Grammars work on bytes; tokenizers store tokens in their own encodings: byte-level BPE
(GPT-2, Llama 3, SmolLM2) maps every byte to a printable character, SentencePiece writes
spaces as "▁" and raw bytes as "<0xNN>", and the `ByteTokenizer` of `dummy:` models is
ids 0..255 = bytes. Special tokens have no bytes (None): a grammar never allows them as text.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from radixmesh.tokenizer import ByteTokenizer


@dataclass(frozen=True)
class Vocab:
    """What a grammar backend is built from."""

    token_bytes: list[bytes | None]  # [vocab_size]
    stop_token_ids: list[int]
    hf_tokenizer: Any = None  # when the model has one (xgrammar reads its metadata)
    name: str = ""  # identifies the tokenizer in compile-cache keys

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)


def vocab_of(tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> Vocab | None:
    """The Vocab of a radixmesh tokenizer; None when its token bytes are unknown."""
    hf = getattr(tokenizer, "hf_tokenizer", None)
    if hf is not None:
        name = f"hf:{getattr(hf, 'name_or_path', '')}:{len(hf)}:{vocab_size}"
        return Vocab(vocab_bytes(hf, vocab_size), stop_token_ids, hf, name)
    if isinstance(tokenizer, ByteTokenizer):
        special = set(stop_token_ids) | {tokenizer.bos_token_id}
        table = [None if i in special else bytes([i]) for i in range(256)]
        token_bytes: list[bytes | None] = [*table, *([None] * (vocab_size - 256))]
        return Vocab(token_bytes, stop_token_ids, None, f"bytes:{vocab_size}")
    return None


_SPIECE_SPACE = "▁"


@functools.cache
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable-character table, inverted: char -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return {ch: b for b, ch in table.items()}


def _is_byte_level(tokens: list[str | None]) -> bool:
    return any(t is not None and t.startswith("Ġ") for t in tokens[:50_000])


def vocab_bytes(hf_tokenizer: Any, vocab_size: int) -> list[bytes | None]:
    """`[vocab_size]`: the bytes of each id; None for special, unknown or padding ids."""
    n = min(vocab_size, len(hf_tokenizer))
    tokens: list[str | None] = list(hf_tokenizer.convert_ids_to_tokens(list(range(n))))
    special = set(hf_tokenizer.all_special_ids)
    special.update(int(i) for i in getattr(hf_tokenizer, "added_tokens_decoder", {}))
    decode = _byte_level_token if _is_byte_level(tokens) else _sentencepiece_token
    out: list[bytes | None] = [None] * vocab_size
    for i, tok in enumerate(tokens):
        if tok is not None and i not in special:
            out[i] = decode(tok)
    return out


def _byte_level_token(token: str) -> bytes | None:
    table = _byte_level_decoder()
    try:
        return bytes(table[ch] for ch in token)
    except KeyError:
        return None


def _sentencepiece_token(token: str) -> bytes | None:
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])
    return token.replace(_SPIECE_SPACE, " ").encode()

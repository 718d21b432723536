"""The bytes each token id stands for, from a Hugging Face tokenizer's vocabulary.

Grammars work on bytes; tokenizers store tokens in their own encodings: byte-level BPE
(GPT-2, Llama 3, SmolLM2) maps every byte to a printable character, SentencePiece writes
spaces as "▁" and raw bytes as "<0xNN>". Special tokens have no bytes (None): a grammar
never allows them as text.
"""

from __future__ import annotations

import functools
from typing import Any

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

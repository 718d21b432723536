"""A grammar's key: one definition for worker and router.

A worker announces the grammars its compile cache holds (cache events of kind
"grammar_compiled" / "grammar_evicted" carrying these keys); the router computes the key
of a request's constraint the same way and prefers, among workers that cost about the
same, one that holds it (router/policy.py, grammar affinity). Both sides must agree bit
for bit, so this module is the only place the key is defined.

The key is the first 8 bytes (little-endian) of BLAKE2b over the constraint's kind, a NUL
and its text, both UTF-8: stable across processes, machines and Python versions (no
`hash()`); a kind is one of a few fixed names, none with a NUL in it, so the NUL ends it
unambiguously. `choices`
arrive as their strings joined by NUL (`SamplingParams.constraint`), on both sides.

The tokenizer and grammar backend are not in the key: the workers behind one router serve
one model. A collision (~2**-64 for unrelated constraints) only misleads a routing choice:
the worker compiles by the constraint's text, never by this key.
"""

from __future__ import annotations

import hashlib

CHOICES_SEPARATOR = "\x00"  # how a `choices` constraint's strings are joined into its text


def grammar_key(kind: str, text: str) -> int:
    """The 64-bit key of the constraint (`kind`, `text`)."""
    digest = hashlib.blake2b(f"{kind}\x00{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")

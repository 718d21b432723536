"""Constrained decoding: grammar backends, token bitmasks and compressed-FSM jump-forward.

- `grammar.py`: the backend interface (compile -> matcher) every backend implements;
- `vocab.py`: the model's vocabulary as bytes per token id (HF tokenizers, byte tokenizer);
- `xgrammar_backend.py` (default) and `outlines_backend.py`, chosen through `registry.py`;
- `compile_cache.py`: asynchronous compilation with a cache keyed by (kind, text, tokenizer);
- `bitmask.py`: one int32 bitmask per step for the constrained rows, applied in the sampler;
- `jump_forward.py`: forced strings -> tokens, retokenized with the boundary token;
- `manager.py`: what the worker calls (validate, attach, mask, advance after a sample).
"""

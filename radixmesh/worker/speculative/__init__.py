"""Speculative decoding: drafts proposed without the model, verified by it.

A decoding request's step computes its next token and k drafted tokens after it in one
forward (a row of 1 + k tokens, like a prompt chunk); every position's logits are
sampled with the request's own rules, and the drafts are kept up to the first one the
model would not have produced. Sampling each position and accepting a draft when the
sample equals it is exactly the target distribution for a drafter that proposes one
token per position (the rejection rule of speculative sampling with a point-mass draft):
greedy output is what plain decoding gives, and sampled output has its distribution.

- `ngram.py`: drafts from the request's own prompt and output (prompt lookup).
- `radix.py`: drafts from the radix tree: what earlier requests generated after the
  same text (then the n-gram drafter).
- `draft_model.py`: drafts from a smaller model run beside the target.
- `eagle.py`: drafts from an EAGLE head over the target's own features (`eagle_head.py`:
  the head's layer and its checkpoint loader).
- `registry.py`: the drafters by name (`--speculative`).
- `verify.py`: which drafts a row keeps, from its positions' samples.
- `speculator.py`: which requests draft in a step, and the adaptive rule that stops a
  request drafting while its drafts are rejected; the counters.
"""

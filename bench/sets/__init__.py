"""Prompt sets the benchmarks and tests share (copy_heavy: speculative decoding's)."""

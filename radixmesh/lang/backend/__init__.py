"""Backends of the language: in-process engine, OpenAI, Anthropic, the cluster (later)."""

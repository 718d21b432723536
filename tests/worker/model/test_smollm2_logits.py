"""The bundled SmolLM2-135M through our loader and model vs transformers' own GGUF load.

All eight prompts run as one ragged batch (prefill together, then decode together), so
this also covers mixed sequence lengths with the real weights.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from radixmesh.worker.model import loader
from radixmesh.worker.model.llama import LlamaForCausalLM
from tests.worker.model.helpers import RaggedRunner

pytestmark = pytest.mark.slow

NEW_TOKENS = 16
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "1, 1, 2, 3, 5, 8, 13,",
    "Translate to German: The weather is nice today.",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who "
    "every morning rowed out past the lighthouse. "
    * 6
    + "One day he found a bottle with a letter inside. It said:",
    "Q: What is 17 times 3?\nA:",
    "<|im_start|>user\nGive me three tips for sleeping better.<|im_end|>\n<|im_start|>assistant\n",
    "Hi",
]


@pytest.fixture(scope="module")
def ours(smollm2_gguf: Any) -> LlamaForCausalLM:
    arch = loader.load_arch_config("smollm2")
    model = LlamaForCausalLM(arch, dtype=torch.float32)
    model.load_weights(loader.iter_weights("smollm2", arch, dtype=torch.float32))
    return model.eval()


@pytest.fixture(scope="module")
def prompt_ids(smollm2_tokenizer: Any) -> list[list[int]]:
    return [smollm2_tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


@torch.no_grad()
def hf_greedy(hf: Any, ids: list[int], n: int) -> tuple[torch.Tensor, list[int]]:
    """Logits [S + n - 1, vocab] of the prompt and of n - 1 decode steps, and the n greedy
    tokens (EOS ignored), with transformers' own KV cache."""
    out = hf(torch.tensor([ids]), use_cache=True)
    logits, cache, tokens = [out.logits[0].float()], out.past_key_values, []
    for i in range(n):
        tokens.append(int(logits[-1][-1].argmax()))
        if i < n - 1:
            out = hf(torch.tensor([tokens[-1:]]), past_key_values=cache, use_cache=True)
            logits.append(out.logits[0].float())
    return torch.cat(logits), tokens


def test_logits_and_greedy_continuations_match_transformers(
    ours: LlamaForCausalLM, hf_smollm2: Any, prompt_ids: list[list[int]]
) -> None:
    runner = RaggedRunner(ours, num_slots=4096, max_requests=len(PROMPTS))
    logits = runner.step(list(enumerate(prompt_ids)))  # all prompts in one ragged batch
    tokens = [[int(x[-1].argmax())] for x in logits]
    for _ in range(NEW_TOKENS - 1):  # all sequences decode together
        step = runner.step([(row, t[-1:]) for row, t in enumerate(tokens)])
        for i, x in enumerate(step):
            tokens[i].append(int(x[-1].argmax()))
            logits[i] = torch.cat([logits[i], x])
    worst = 0.0
    for i, ids in enumerate(prompt_ids):
        ref_logits, ref_tokens = hf_greedy(hf_smollm2, ids, NEW_TOKENS)
        rel = float((logits[i] - ref_logits).abs().max() / ref_logits.abs().max())
        worst = max(worst, rel)
        print(
            f"prompt {i} ({len(ids)} tokens): max |diff| / max |logit| = {rel:.2e} over "
            f"prompt and decode positions; continuation {tokens[i] == ref_tokens}"
        )
        assert rel < 1e-3, f"prompt {i}"
        assert tokens[i] == ref_tokens, f"prompt {i}"
    print(f"worst relative logit difference: {worst:.2e}")

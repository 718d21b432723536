"""FP8 weights and FP8 KV cache on the bundled SmolLM2-135M, against the float32 model.

Float32 is the baseline (the CPU's exact dtype; rounding the linear weights to bfloat16
moves this perplexity by +0.2% and leaves 8 of the 9 continuations equal). Each
configuration scores one public-domain English text (perplexity from one prefill, whose
attention reads the KV back from the pool) and greedily continues the usage examples'
prompts as one ragged batch. The FP8 weights run as on a CPU worker: quantized at load,
dequantized once into float32 (layers/quantization/__init__.py).

Measured (docs/quantization.md): float32 12.878; FP8 KV 12.575 (-2.4%), 4 of 9
continuations equal; FP8 weights (the default, per-channel scales) 13.897 (+7.9%), 3 of
9. Finer scales do not close the gap: `python -m bench.fp8_quality` measures 1 x 128 at
+0.2% and 128 x 128 at +10.8%, but re-rounding the same layouts (scales enlarged by a
random 0-6%, which costs e4m3 no precision) moves each by several points either way, so
one figure under 3% there is the luck of rounding. Calibration does: the same
per-channel format with each weight's rounding chosen by GPTQ-style error compensation
and each row's scale by the search over eight candidates (layers/quantization/
fp8_calibrate.py, on the bundled passages, never on this text). `bench.fp8_quality`
measures it calibrated on all the passages: 12.879 (+0.0%; +0.8% against the bf16 model),
-1.6% to +1.1% re-rounded, 6 of 9 continuations equal, KL from float32 0.28 of plain
FP8's. This test calibrates on the even-numbered half of the passages (the bench's "even"
figures): 12.839 (-0.3%), 3 of 9 continuations equal, KL 0.30 of plain FP8's; half the
text halves the forward pass and the Hessians (about 10 s of a calibration on 2 cores),
roughly what the scale search adds to the solver (12 s), so the test stays near its
former time (estimated from the parts' timings, not timed whole on a quiet machine).
The bounds below are the measured figures with some margin, so a regression in any path
fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from radixmesh.worker.kvcache.fp8_kv import FP8
from radixmesh.worker.layers.dense import pack_model_for_cpu
from radixmesh.worker.layers.quantization import dequantize_linears
from radixmesh.worker.layers.quantization.calibration_text import PASSAGES
from radixmesh.worker.model import loader
from radixmesh.worker.model.llama import LlamaForCausalLM
from tests.worker.model.helpers import RaggedRunner

# Abraham Lincoln, the Gettysburg Address (1863), Bliss copy; public domain.
TEXT = (
    "Four score and seven years ago our fathers brought forth on this continent, a new "
    "nation, conceived in Liberty, and dedicated to the proposition that all men are "
    "created equal. Now we are engaged in a great civil war, testing whether that nation, "
    "or any nation so conceived and so dedicated, can long endure. We are met on a great "
    "battle-field of that war. We have come to dedicate a portion of that field, as a final "
    "resting place for those who here gave their lives that that nation might live. It is "
    "altogether fitting and proper that we should do this. But, in a larger sense, we can "
    "not dedicate -- we can not consecrate -- we can not hallow -- this ground. The brave "
    "men, living and dead, who struggled here, have consecrated it, far above our poor "
    "power to add or detract. The world will little note, nor long remember what we say "
    "here, but it can never forget what they did here. It is for us the living, rather, to "
    "be dedicated here to the unfinished work which they who fought here have thus far so "
    "nobly advanced. It is rather for us to be here dedicated to the great task remaining "
    "before us -- that from these honored dead we take increased devotion to that cause for "
    "which they gave the last full measure of devotion -- that we here highly resolve that "
    "these dead shall not have died in vain -- that this nation, under God, shall have a "
    "new birth of freedom -- and that government of the people, by the people, for the "
    "people, shall not perish from the earth."
)
# The usage examples' prompts (docs/usage.md): raw completions, and chat messages through
# the template.
RAW_PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "Is water wet? Answer:",
    "Call me at",
    "The capital of Italy is",
    "The sky is",
]
CHAT_PROMPTS = [
    "What is the capital of France? Answer in one word.",
    "What is the capital of France?",
    "Describe Ada, a 36-year-old programmer, as JSON.",
]
NEW_TOKENS = 16
# FP8 weights calibrated by fp8_calibrate with its defaults (GPTQ-style error compensation
# and the scale search) on the even-numbered half of the bundled passages (never on
# TEXT), in the same per-channel format as "fp8 weights".
CALIBRATED = "fp8 weights calibrated"
CALIBRATION_HALF = slice(0, None, 2)
# Relative perplexity rise allowed against float32 (measured: FP8 KV -2.4% on a Zen 4
# EPYC, -3.3% on an AVX2-only EPYC; FP8 weights +7.9%; calibrated -0.3%, and on all the
# passages -1.6% to +1.1% with the scales enlarged by 0-6%, which only re-rounds:
# bench/fp8_quality.py). A loss of quality is a rise; a fall is rounding noise (which
# values land next to an e4m3 step moves with the CPU's float32 kernels), bounded loosely
# below so that a broken model still fails. The calibrated bound fails plain FP8's +7.9%
# too; which way a handful of this text's tokens round decides a few points of either
# figure, so the sharper check of the calibration is the KL below.
PPL_TOLERANCE = {"fp8 kv": 0.03, "fp8 weights": 0.10, CALIBRATED: 0.05}
PPL_FLOOR = -0.10
# Continuations equal to float32's token for token over all 16 tokens, of 9 (measured 4, 3,
# 3), and the mean length of the common start (measured 11.3, 10.1 and 9.7 of 16 tokens).
MIN_EQUAL_CONTINUATIONS = {"fp8 kv": 3, "fp8 weights": 2, CALIBRATED: 2}
MIN_MEAN_COMMON_START = {"fp8 kv": 8.0, "fp8 weights": 6.0, CALIBRATED: 7.5}
# The calibrated weights' KL from float32 on TEXT, at most this fraction of plain FP8's
# (measured 0.026 against 0.085: 0.30).
MAX_KL_VS_PLAIN = 0.45


@dataclass
class Result:
    perplexity: float
    continuations: list[list[int]]
    log_probs: torch.Tensor | None = None  # the text's next-token log-probabilities [S, vocab]


def prompt_ids() -> list[list[int]]:
    tok = loader.load_tokenizer("smollm2")
    raw = [tok.encode(p) for p in RAW_PROMPTS]
    chat = [tok.encode_chat([{"role": "user", "content": p}]) for p in CHAT_PROMPTS]
    return raw + chat


def evaluate(
    model: LlamaForCausalLM,
    kv_dtype: torch.dtype | None,
    *,
    continue_prompts: bool = True,
    keep_log_probs: bool = False,
) -> Result:
    tok = loader.load_tokenizer("smollm2")
    text = tok.encode(TEXT)
    prompts = prompt_ids()
    runner = RaggedRunner(model, num_slots=4096, max_requests=len(prompts) + 1, kv_dtype=kv_dtype)
    logits = runner.step([(0, text)])[0]  # [S, vocab]
    nll = F.cross_entropy(logits[:-1], torch.tensor(text[1:]))
    log_probs = logits.log_softmax(-1) if keep_log_probs else None
    if not continue_prompts:
        return Result(math.exp(float(nll)), [], log_probs)
    steps = runner.step([(i + 1, ids) for i, ids in enumerate(prompts)])
    tokens = [[int(x[-1].argmax())] for x in steps]
    for _ in range(NEW_TOKENS - 1):  # every prompt decodes in the same steps
        steps = runner.step([(i + 1, t[-1:]) for i, t in enumerate(tokens)])
        for t, x in zip(tokens, steps, strict=True):
            t.append(int(x[-1].argmax()))
    return Result(math.exp(float(nll)), tokens, log_probs)


def load_model(weights: dict[str, torch.Tensor], quantization: str | None) -> LlamaForCausalLM:
    arch = loader.load_arch_config("smollm2")
    model = LlamaForCausalLM(arch, dtype=torch.float32, quantization=quantization)
    model.load_weights(weights.items())
    dequantize_linears(model, torch.float32)  # what a CPU worker does with FP8 weights
    pack_model_for_cpu(model)
    return model.eval()


@pytest.fixture(scope="module")
def weights(smollm2_gguf: Any) -> dict[str, torch.Tensor]:
    arch = loader.load_arch_config("smollm2")
    return dict(loader.iter_weights("smollm2", arch, dtype=torch.float32))


@pytest.fixture(scope="module")
def results(weights: dict[str, torch.Tensor]) -> dict[str, Result]:
    base = load_model(weights, None)
    out = {"float32": evaluate(base, None, keep_log_probs=True), "fp8 kv": evaluate(base, FP8)}
    del base
    fp8 = load_model(weights, "fp8")
    out["fp8 weights"] = evaluate(fp8, None, keep_log_probs=True)
    out["fp8 weights + kv"] = evaluate(fp8, FP8, continue_prompts=False)  # for the docs
    for name, r in out.items():
        report(name, r, out["float32"])
    return out


def report(name: str, r: Result, base: Result) -> None:
    tok = loader.load_tokenizer("smollm2")
    print(f"{name}: perplexity {r.perplexity:.4f}")
    if r.log_probs is not None and base.log_probs is not None and r is not base:
        print(f"  KL from float32 {kl_from(r, base):.4f}")
    if r.continuations:
        equal = equal_continuations(r, base)
        common = mean_common_start(r, base)
        print(f"  {equal}/9 continuations equal, common start {common:.1f} tokens")
        print("\n".join(f"    {tok.decode(ids)!r}" for ids in r.continuations))


@pytest.fixture(scope="module")
def calibrated(weights: dict[str, torch.Tensor], results: dict[str, Result]) -> Result:
    """The FP8 weights `fp8_calibrate` writes (calibrated on the bundled passages, not on
    TEXT), run as a CPU worker runs them: the dequantized values, packed."""
    from radixmesh.worker.layers.quantization import fp8_calibrate

    model = LlamaForCausalLM(loader.load_arch_config("smollm2"), dtype=torch.float32)
    model.load_weights(weights.items())
    tok = loader.load_tokenizer("smollm2")
    sequences = fp8_calibrate.calibration_sequences(tok, PASSAGES[CALIBRATION_HALF])
    fp8_calibrate.calibrate(model, sequences)
    pack_model_for_cpu(model)
    result = evaluate(model, None, keep_log_probs=True)
    report(CALIBRATED, result, results["float32"])
    return result


def kl_from(ours: Result, base: Result) -> float:
    """KL(base || ours) of the next-token distributions on TEXT, mean over positions (as
    bench/fp8_quality.py reports it)."""
    assert ours.log_probs is not None and base.log_probs is not None
    return float(F.kl_div(ours.log_probs, base.log_probs, log_target=True, reduction="batchmean"))


def equal_continuations(a: Result, b: Result) -> int:
    return sum(x == y for x, y in zip(a.continuations, b.continuations, strict=True))


def mean_common_start(a: Result, b: Result) -> float:
    """Mean over prompts of how many leading tokens two continuations share."""
    lengths = []
    for x, y in zip(a.continuations, b.continuations, strict=True):
        n = 0
        while n < len(x) and x[n] == y[n]:
            n += 1
        lengths.append(n)
    return sum(lengths) / len(lengths)


def result_of(config: str, request: pytest.FixtureRequest) -> Result:
    """A configuration's result; the calibrated one's fixture runs only where asked for."""
    if config == CALIBRATED:
        result: Result = request.getfixturevalue("calibrated")
        return result
    results: dict[str, Result] = request.getfixturevalue("results")
    return results[config]


@pytest.mark.parametrize("config", ["fp8 weights", "fp8 kv", CALIBRATED])
def test_perplexity_close_to_float32(
    results: dict[str, Result], config: str, request: pytest.FixtureRequest
) -> None:
    base = results["float32"].perplexity
    assert 5.0 < base < 30.0  # the model reads English: a sane baseline (measured 12.88)
    ours = result_of(config, request)
    assert PPL_FLOOR <= ours.perplexity / base - 1.0 <= PPL_TOLERANCE[config]


@pytest.mark.parametrize("config", ["fp8 weights", "fp8 kv", CALIBRATED])
def test_greedy_continuations_agree_with_float32(
    results: dict[str, Result], config: str, request: pytest.FixtureRequest
) -> None:
    ours, base = result_of(config, request), results["float32"]
    assert equal_continuations(ours, base) >= MIN_EQUAL_CONTINUATIONS[config]
    assert mean_common_start(ours, base) >= MIN_MEAN_COMMON_START[config]


def test_calibration_moves_the_model_much_less_than_plain_fp8(
    results: dict[str, Result], calibrated: Result
) -> None:
    """The robust measure of the two: how far the next-token distributions on the whole
    text move from float32's (KL), which a handful of tokens cannot swing as they swing
    the perplexity."""
    plain = kl_from(results["fp8 weights"], results["float32"])
    assert 0.0 < kl_from(calibrated, results["float32"]) <= MAX_KL_VS_PLAIN * plain

"""FP8 weights on the bundled SmolLM2-135M (CPU): how far each scale layout, and the
calibrated (GPTQ-style) per-channel weights, move the model from float32, and how much
of that is the luck of rounding.

For each layout (per channel, 1 x 128, 128 x 128; fp8_scales.py) and for per-channel
weights calibrated by `fp8_calibrate` on the bundled passages (`fp8-channel-gptq`): the
perplexity of tests/worker/model/test_fp8_quality.py's text (one prefill) against
float32's, the mean KL divergence of the next-token distributions from float32's and
their top-1 agreement, first with the scales as the engine computes them (amax / 448),
then `--reroundings` times with every scale enlarged by a random 0-6% (the calibrated
weights calibrated anew at those scales). Enlarging a scale moves no value out of e4m3's
range and costs no precision (a float format keeps 3 mantissa bits at any scale), but it
re-rounds every weight: the spread of those runs is the noise any one figure carries on
this model and text. With the engine's scales also the quality test's greedy
continuations (9 prompts, 16 tokens), compared token for token with float32's.

The calibrated weights are also calibrated on each half of the bundled passages
(`calibration_text.PASSAGES`, even- and odd-numbered), with the columns in the default
order (decreasing H diagonal) and in their natural order: the same figures on the scored
text, and the KL on the other half's passages, which that calibration never saw, beside
plain FP8's KL there.

Run: `python -m bench.fp8_quality [--reroundings 3] [--layouts ...]` (about 10 s per
plain model and 40 s per calibrated one on 2 cores); writes
bench/results/fp8_quality-<machine>.json (or --out).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from bench import record
from radixmesh.worker.layers.quantization import fp8_scales
from radixmesh.worker.model import loader
from radixmesh.worker.model.llama import LlamaForCausalLM

LAYOUTS = ("fp8-channel", "fp8-1x128", "fp8-128x128")
CALIBRATED = "fp8-channel-gptq"
JITTER = 0.06


def log_probs(model: LlamaForCausalLM, texts: Sequence[list[int]]) -> list[torch.Tensor]:
    """Each text's next-token log-probabilities [S, vocab], one prefill of them all."""
    from tests.worker.model.helpers import RaggedRunner

    runner = RaggedRunner(
        model,
        num_slots=sum(map(len, texts)) + 1,
        max_requests=len(texts),
        max_context=max(map(len, texts)),
    )
    return [x.log_softmax(-1) for x in runner.step(list(enumerate(texts)))]


def compare(lp: torch.Tensor, ref: torch.Tensor, text: list[int]) -> dict[str, float]:
    target = torch.tensor(text[1:])
    nll, nll_ref = F.nll_loss(lp[:-1], target), F.nll_loss(ref[:-1], target)
    return {
        "perplexity": math.exp(float(nll)),
        "perplexity_vs_float32": math.exp(float(nll - nll_ref)) - 1,
        "kl": float(F.kl_div(lp, ref, log_target=True, reduction="batchmean")),
        "top1_agreement": float((lp.argmax(-1) == ref.argmax(-1)).float().mean()),
    }


def mean_kl(lps: Sequence[torch.Tensor], refs: Sequence[torch.Tensor]) -> float:
    """KL from the reference, averaged over every position of every text."""
    pairs = zip(lps, refs, strict=True)
    total = sum(float(F.kl_div(a, b, log_target=True, reduction="sum")) for a, b in pairs)
    return total / sum(len(a) for a in lps)


def jittered(seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    exact = fp8_scales._scale_of
    return lambda amax: exact(amax) * (1 + JITTER * torch.rand(amax.shape, generator=gen))


def calibrated_model(
    weights: dict[str, torch.Tensor], passages: Sequence[str], *, act_order: bool = True
) -> LlamaForCausalLM:
    """SmolLM2 with its linear weights calibrated on `passages`, as a CPU worker runs the
    checkpoint `fp8_calibrate` writes: the dequantized FP8 values, packed."""
    from radixmesh.worker.layers.dense import pack_model_for_cpu
    from radixmesh.worker.layers.quantization import fp8_calibrate

    arch = loader.load_arch_config("smollm2")
    model = LlamaForCausalLM(arch, dtype=torch.float32)
    model.load_weights(weights.items())
    sequences = fp8_calibrate.calibration_sequences(loader.load_tokenizer("smollm2"), passages)
    fp8_calibrate.calibrate(model.eval(), sequences, act_order=act_order)
    pack_model_for_cpu(model)
    return model


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reroundings", type=int, default=3, help="runs with enlarged scales")
    ap.add_argument(
        "--layouts",
        default=",".join((*LAYOUTS, CALIBRATED)),
        help=f"comma-separated, of {', '.join((*LAYOUTS, CALIBRATED))}",
    )
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    layouts = [name for name in args.layouts.split(",") if name]
    for name in layouts:
        if name not in (*LAYOUTS, CALIBRATED):
            raise ValueError(f"layouts: unknown {name!r}")
    arch = loader.load_arch_config("smollm2")
    weights = dict(loader.iter_weights("smollm2", arch, dtype=torch.float32))
    # The quality test's text, model loading and continuations, imported here: importing
    # this module (as every benchmark module is, in tests/bench) must not import tests.
    from radixmesh.worker.layers.quantization.calibration_text import PASSAGES
    from tests.worker.model import test_fp8_quality as quality

    tok = loader.load_tokenizer("smollm2")
    text = tok.encode(quality.TEXT)
    base = quality.load_model(weights, None)
    ref = log_probs(base, [text])[0]
    base_result = quality.evaluate(base, None)
    del base

    def continuations(model: LlamaForCausalLM) -> dict[str, float]:
        r = quality.evaluate(model, None)
        return {
            "continuations_equal": quality.equal_continuations(r, base_result),
            "mean_common_start": quality.mean_common_start(r, base_result),
        }

    def load(layout: str) -> LlamaForCausalLM:
        if layout == CALIBRATED:
            return calibrated_model(weights, PASSAGES)
        return quality.load_model(weights, layout)

    results: dict[str, Any] = {}
    exact = fp8_scales._scale_of
    for layout in layouts:
        runs = []
        for seed in range(args.reroundings + 1):  # seed 0: the engine's exact scales
            fp8_scales._scale_of = exact if seed == 0 else jittered(seed)  # type: ignore[assignment]
            try:
                start = time.perf_counter()
                model = load(layout)
                seconds = time.perf_counter() - start
            finally:
                fp8_scales._scale_of = exact
            runs.append(compare(log_probs(model, [text])[0], ref, text))
            if layout == CALIBRATED:
                runs[-1]["load_and_calibrate_s"] = round(seconds, 1)
            if seed == 0:
                runs[-1].update(continuations(model))
            r = runs[-1]
            print(
                f"{layout:16} {'exact' if seed == 0 else f'rerounded {seed}':12} perplexity "
                f"{r['perplexity']:.3f} ({r['perplexity_vs_float32']:+.2%}), KL {r['kl']:.4f}, "
                f"top-1 {r['top1_agreement']:.3f}"
                + (
                    f", {r['continuations_equal']}/9 continuations equal, common start "
                    f"{r['mean_common_start']:.1f}"
                    if seed == 0
                    else ""
                ),
                flush=True,
            )
        ppl = [r["perplexity_vs_float32"] for r in runs]
        results[layout] = {
            "runs": runs,
            "perplexity_vs_float32_mean": statistics.mean(ppl),
            "kl_mean": statistics.mean(r["kl"] for r in runs),
        }
        kl = results[layout]["kl_mean"]
        print(
            f"{layout:16} mean over {len(runs)}: perplexity {statistics.mean(ppl):+.2%}, "
            f"range {min(ppl):+.2%} to {max(ppl):+.2%}, KL {kl:.4f}",
            flush=True,
        )
    if CALIBRATED in layouts:
        results[CALIBRATED]["halves"] = halves(weights, text, ref, PASSAGES)
    record.write("fp8_quality", args, {"jitter": JITTER, "layouts": results})


def halves(
    weights: dict[str, torch.Tensor], text: list[int], ref: torch.Tensor, passages: Sequence[str]
) -> dict[str, Any]:
    """Calibrated on each half of the passages, columns by decreasing H diagonal (the
    default) and in their natural order: the scored text's figures, and the KL on the
    other half (never calibrated on) beside plain per-channel FP8's there."""
    from tests.worker.model import test_fp8_quality as quality

    tok = loader.load_tokenizer("smollm2")
    parts = {"even": list(passages[0::2]), "odd": list(passages[1::2])}
    encoded = {name: [tok.encode(p) for p in part] for name, part in parts.items()}
    base = quality.load_model(weights, None)
    refs = {name: log_probs(base, texts) for name, texts in encoded.items()}
    plain = quality.load_model(weights, "fp8-channel")
    plain_kl = {name: mean_kl(log_probs(plain, ts), refs[name]) for name, ts in encoded.items()}
    del base, plain
    out: dict[str, Any] = {}
    for act_order in (True, False):
        for name, other in (("even", "odd"), ("odd", "even")):
            model = calibrated_model(weights, parts[name], act_order=act_order)
            r = compare(log_probs(model, [text])[0], ref, text)
            r["heldout_kl"] = mean_kl(log_probs(model, encoded[other]), refs[other])
            r["heldout_kl_plain_fp8"] = plain_kl[other]
            r["calibration_tokens"] = sum(map(len, encoded[name]))
            key = name if act_order else f"{name}-natural-order"
            out[key] = r
            print(
                f"{CALIBRATED:16} {key:18} perplexity {r['perplexity']:.3f} "
                f"({r['perplexity_vs_float32']:+.2%}), KL {r['kl']:.4f}, top-1 "
                f"{r['top1_agreement']:.3f}; KL on the {other} half {r['heldout_kl']:.4f} "
                f"(plain FP8 {r['heldout_kl_plain_fp8']:.4f})",
                flush=True,
            )
    return out


if __name__ == "__main__":
    main()

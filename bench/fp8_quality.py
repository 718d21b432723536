"""FP8 weights on the bundled SmolLM2-135M (CPU): how far each scale layout, and the
calibrated (GPTQ-style, scales searched) per-channel weights, move the model from float32
and from bf16, and how much of that is the luck of rounding.

References: the model in float32 (the CPU's exact dtype: KL and top-1 are against it), in
bf16 as the engine serves it with dtype="bfloat16" (weights and activations; the FP8
target's reference, `perplexity_vs_bf16`), and with only its linear weights rounded to
bf16 (computed in float32). For each layout (per channel, 1 x 128, 128 x 128;
fp8_scales.py) and for per-channel weights calibrated by `fp8_calibrate` with its
defaults on the bundled passages (`fp8-channel-gptq`): the perplexity of
tests/worker/model/test_fp8_quality.py's text (one prefill) against float32's and bf16's,
the mean KL divergence of the next-token distributions from float32's and their top-1
agreement, first with the scales as the engine computes them (amax / 448; the calibrated
weights search their own scales from there), then `--reroundings` times with every amax /
448 enlarged by a random 0-6% (the calibrated weights calibrated anew from those).
Enlarging a scale moves no value out of e4m3's range and costs no precision (a float
format keeps 3 mantissa bits at any scale), but it re-rounds every weight: the spread of
those runs is the noise any one figure carries on this model and text. With the engine's
scales also the quality test's greedy continuations (9 prompts, 16 tokens), compared
token for token with float32's.

The calibrated weights are also calibrated on each half of the bundled passages
(`calibration_text.PASSAGES`, even- and odd-numbered) with the defaults and with each of
`HALF_VARIANTS` changed (amax / 448 alone, 1% damping, the natural column order): the
same figures on the scored text, and the KL and perplexity on the other half's passages,
which that calibration never saw, beside plain FP8's there. Those held-out figures are
what fp8_calibrate's defaults were chosen on.

Run: `python -m bench.fp8_quality [--reroundings 3] [--layouts ...]` (about 10 s per
plain model, 45 s per calibrated one and 40 s per half on 2 cores); writes
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
# What the halves change from the command's defaults, each alone (fp8_calibrate.calibrate's
# options): "default" first.
HALF_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "engine-scales": {"ratios": (1.0,)},
    "damp-0.01": {"damp": 0.01},
    "natural-order": {"act_order": False},
}


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


def compare(
    lp: torch.Tensor, ref: torch.Tensor, text: list[int], bf16: torch.Tensor | None = None
) -> dict[str, float]:
    """Perplexity of `text` against the float32 model's (`ref`) and, given the bf16 model's
    log-probabilities, against bf16's; KL and top-1 agreement against float32's."""
    target = torch.tensor(text[1:])
    nll, nll_ref = F.nll_loss(lp[:-1], target), F.nll_loss(ref[:-1], target)
    out = {
        "perplexity": math.exp(float(nll)),
        "perplexity_vs_float32": math.exp(float(nll - nll_ref)) - 1,
    }
    if bf16 is not None:
        out["perplexity_vs_bf16"] = math.exp(float(nll - F.nll_loss(bf16[:-1], target))) - 1
    out["kl"] = float(F.kl_div(lp, ref, log_target=True, reduction="batchmean"))
    out["top1_agreement"] = float((lp.argmax(-1) == ref.argmax(-1)).float().mean())
    return out


def mean_kl(lps: Sequence[torch.Tensor], refs: Sequence[torch.Tensor]) -> float:
    """KL from the reference, averaged over every position of every text."""
    pairs = zip(lps, refs, strict=True)
    total = sum(float(F.kl_div(a, b, log_target=True, reduction="sum")) for a, b in pairs)
    return total / sum(len(a) for a in lps)


def nll_sum(lps: Sequence[torch.Tensor], texts: Sequence[list[int]]) -> tuple[float, int]:
    """Summed negative log-likelihood of every text's tokens after its first, and their count."""
    pairs = zip(lps, texts, strict=True)
    total = sum(float(F.nll_loss(lp[:-1], torch.tensor(t[1:]), reduction="sum")) for lp, t in pairs)
    return total, sum(len(t) - 1 for t in texts)


def perplexity_vs(
    lps: Sequence[torch.Tensor], refs: Sequence[torch.Tensor], texts: Sequence[list[int]]
) -> float:
    """Relative perplexity over all of `texts` (every token weighted alike) against refs'."""
    (nll, n), (nll_ref, _) = nll_sum(lps, texts), nll_sum(refs, texts)
    return math.exp((nll - nll_ref) / n) - 1


def jittered(seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    exact = fp8_scales._scale_of
    return lambda amax: exact(amax) * (1 + JITTER * torch.rand(amax.shape, generator=gen))


def calibrated_model(
    weights: dict[str, torch.Tensor], passages: Sequence[str], **options: Any
) -> LlamaForCausalLM:
    """SmolLM2 with its linear weights calibrated on `passages` (`options`: calibrate's,
    default the command's), as a CPU worker runs the checkpoint `fp8_calibrate` writes:
    the dequantized FP8 values, packed."""
    from radixmesh.worker.layers.dense import pack_model_for_cpu
    from radixmesh.worker.layers.quantization import fp8_calibrate

    arch = loader.load_arch_config("smollm2")
    model = LlamaForCausalLM(arch, dtype=torch.float32)
    model.load_weights(weights.items())
    sequences = fp8_calibrate.calibration_sequences(loader.load_tokenizer("smollm2"), passages)
    fp8_calibrate.calibrate(model.eval(), sequences, **options)
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
    bf16 = log_probs(bf16_model(weights), [text])[0]
    bf16_weights = log_probs(quality.load_model(bf16_rounded(weights), None), [text])[0]
    references = {
        name: compare(lp, ref, text, bf16)
        for name, lp in (("float32", ref), ("bf16", bf16), ("bf16_weights", bf16_weights))
    }
    for name, r in references.items():
        print(
            f"{name:16} perplexity {r['perplexity']:.3f} ({r['perplexity_vs_float32']:+.2%} "
            f"vs float32), KL {r['kl']:.4f}",
            flush=True,
        )

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
            runs.append(compare(log_probs(model, [text])[0], ref, text, bf16))
            if layout == CALIBRATED:
                runs[-1]["load_and_calibrate_s"] = round(seconds, 1)
            if seed == 0:
                runs[-1].update(continuations(model))
            r = runs[-1]
            print(
                f"{layout:16} {'exact' if seed == 0 else f'rerounded {seed}':12} perplexity "
                f"{r['perplexity']:.3f} ({r['perplexity_vs_float32']:+.2%} vs float32, "
                f"{r['perplexity_vs_bf16']:+.2%} vs bf16), KL {r['kl']:.4f}, "
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
            "perplexity_vs_bf16_mean": statistics.mean(r["perplexity_vs_bf16"] for r in runs),
            "kl_mean": statistics.mean(r["kl"] for r in runs),
        }
        kl = results[layout]["kl_mean"]
        print(
            f"{layout:16} mean over {len(runs)}: perplexity {statistics.mean(ppl):+.2%}, "
            f"range {min(ppl):+.2%} to {max(ppl):+.2%}, KL {kl:.4f}",
            flush=True,
        )
    if CALIBRATED in layouts:
        results[CALIBRATED]["halves"] = halves(weights, text, ref, bf16, PASSAGES)
    record.write(
        "fp8_quality", args, {"jitter": JITTER, "references": references, "layouts": results}
    )


def bf16_model(weights: dict[str, torch.Tensor]) -> LlamaForCausalLM:
    """The model as the engine serves it in bfloat16 (`dtype="bfloat16"`): every weight and
    activation in bf16."""
    from radixmesh.worker.layers.dense import pack_model_for_cpu

    model = LlamaForCausalLM(loader.load_arch_config("smollm2"), dtype=torch.bfloat16)
    model.load_weights(weights.items())
    pack_model_for_cpu(model)
    return model.eval()


def bf16_rounded(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The decoder's linear weights (those FP8 quantizes) rounded to bf16, in float32."""
    return {
        name: w.to(torch.bfloat16).float() if name.endswith("proj.weight") else w
        for name, w in weights.items()
    }


def halves(
    weights: dict[str, torch.Tensor],
    text: list[int],
    ref: torch.Tensor,
    bf16: torch.Tensor,
    passages: Sequence[str],
) -> dict[str, Any]:
    """Calibrated on each half of the passages (even- and odd-numbered), with the default
    options and with each of `HALF_VARIANTS` changed: the scored text's figures, and the
    KL and perplexity on the other half (never calibrated on) beside plain per-channel
    FP8's there. The other half's figures are what the choices were made on."""
    from radixmesh.worker.layers.quantization import fp8_calibrate
    from tests.worker.model import test_fp8_quality as quality

    tok = loader.load_tokenizer("smollm2")
    parts = {"even": list(passages[0::2]), "odd": list(passages[1::2])}
    # Scored as calibration cuts them: pieces of at most SEQ_LEN tokens.
    encoded = {name: fp8_calibrate.calibration_sequences(tok, p) for name, p in parts.items()}
    base = quality.load_model(weights, None)
    refs = {name: log_probs(base, texts) for name, texts in encoded.items()}
    plain = quality.load_model(weights, "fp8-channel")
    plain_lps = {name: log_probs(plain, texts) for name, texts in encoded.items()}
    del base, plain
    out: dict[str, Any] = {}
    for variant, options in HALF_VARIANTS.items():
        for name, other in (("even", "odd"), ("odd", "even")):
            model = calibrated_model(weights, parts[name], **options)
            r = compare(log_probs(model, [text])[0], ref, text, bf16)
            lps = log_probs(model, encoded[other])
            del model
            r["heldout_kl"] = mean_kl(lps, refs[other])
            r["heldout_kl_plain_fp8"] = mean_kl(plain_lps[other], refs[other])
            r["heldout_perplexity_vs_float32"] = perplexity_vs(lps, refs[other], encoded[other])
            r["heldout_perplexity_vs_float32_plain_fp8"] = perplexity_vs(
                plain_lps[other], refs[other], encoded[other]
            )
            r["calibration_tokens"] = sum(map(len, encoded[name]))
            key = name if variant == "default" else f"{name}-{variant}"
            out[key] = r
            print(
                f"{CALIBRATED:16} {key:22} perplexity {r['perplexity']:.3f} "
                f"({r['perplexity_vs_float32']:+.2%}), KL {r['kl']:.4f}, top-1 "
                f"{r['top1_agreement']:.3f}; on the {other} half KL {r['heldout_kl']:.4f} "
                f"(plain FP8 {r['heldout_kl_plain_fp8']:.4f}), perplexity "
                f"{r['heldout_perplexity_vs_float32']:+.2%} "
                f"(plain FP8 {r['heldout_perplexity_vs_float32_plain_fp8']:+.2%})",
                flush=True,
            )
    return out


if __name__ == "__main__":
    main()

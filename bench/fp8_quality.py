"""FP8 weight scale layouts on the bundled SmolLM2-135M (CPU): how far each moves the model
from float32, and how much of that is the luck of rounding.

For each layout (per channel, 1 x 128, 128 x 128; fp8_scales.py) the perplexity of
tests/worker/model/test_fp8_quality.py's text (one prefill) against float32's, the mean
KL divergence of the next-token distributions from float32's and their top-1 agreement,
first with the scales as the engine computes them (amax / 448), then `--reroundings` times
with every scale enlarged by a random 0-6%. Enlarging a scale moves no value out of
e4m3's range and costs no precision (a float format keeps 3 mantissa bits at any scale),
but it re-rounds every weight: the spread of those runs is the noise any one layout's
figure carries on this model and text.

Run: `python -m bench.fp8_quality [--reroundings 3]` (about 30 s per model on 2 cores);
writes bench/results/fp8_quality-<machine>.json (or --out).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from bench import record
from radixmesh.worker.layers.quantization import fp8_scales
from radixmesh.worker.model import loader
from radixmesh.worker.model.llama import LlamaForCausalLM

LAYOUTS = ("fp8-channel", "fp8-1x128", "fp8-128x128")
JITTER = 0.06


def log_probs(model: LlamaForCausalLM, text: list[int]) -> torch.Tensor:
    from tests.worker.model.helpers import RaggedRunner

    runner = RaggedRunner(model, num_slots=4096, max_requests=2)
    return runner.step([(0, text)])[0].log_softmax(-1)  # [S, vocab]


def compare(lp: torch.Tensor, ref: torch.Tensor, text: list[int]) -> dict[str, float]:
    target = torch.tensor(text[1:])
    nll, nll_ref = F.nll_loss(lp[:-1], target), F.nll_loss(ref[:-1], target)
    return {
        "perplexity": math.exp(float(nll)),
        "perplexity_vs_float32": math.exp(float(nll - nll_ref)) - 1,
        "kl": float(F.kl_div(lp, ref, log_target=True, reduction="batchmean")),
        "top1_agreement": float((lp.argmax(-1) == ref.argmax(-1)).float().mean()),
    }


def jittered(seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    exact = fp8_scales._scale_of
    return lambda amax: exact(amax) * (1 + JITTER * torch.rand(amax.shape, generator=gen))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reroundings", type=int, default=3, help="runs with enlarged scales")
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    arch = loader.load_arch_config("smollm2")
    weights = dict(loader.iter_weights("smollm2", arch, dtype=torch.float32))
    # The quality test's text and model loading, imported here: importing this module
    # (as every benchmark module is, in tests/bench) must not import test modules.
    from tests.worker.model import test_fp8_quality as quality

    text = loader.load_tokenizer("smollm2").encode(quality.TEXT)
    ref = log_probs(quality.load_model(weights, None), text)
    results: dict[str, Any] = {}
    exact = fp8_scales._scale_of
    for layout in LAYOUTS:
        runs = []
        for seed in range(args.reroundings + 1):  # seed 0: the engine's exact scales
            fp8_scales._scale_of = exact if seed == 0 else jittered(seed)  # type: ignore[assignment]
            try:
                runs.append(
                    compare(log_probs(quality.load_model(weights, layout), text), ref, text)
                )
            finally:
                fp8_scales._scale_of = exact
            r = runs[-1]
            print(
                f"{layout:12} {'exact' if seed == 0 else f'rerounded {seed}':12} perplexity "
                f"{r['perplexity']:.3f} ({r['perplexity_vs_float32']:+.2%}), KL {r['kl']:.4f}, "
                f"top-1 {r['top1_agreement']:.3f}",
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
            f"{layout:12} mean over {len(runs)}: perplexity {statistics.mean(ppl):+.2%}, "
            f"range {min(ppl):+.2%} to {max(ppl):+.2%}, KL {kl:.4f}"
        )
    record.write("fp8_quality", args, {"jitter": JITTER, "layouts": results})


if __name__ == "__main__":
    main()

"""What the FP8 decode kernel's paths cost the bundled SmolLM2-135M in quality.

The text of tests/worker/model/test_fp8_quality.py is scored token by token through the
decode kernel (teacher forcing: one prefill of its first token, then one decode step per
token), with the KV cache in FP8, through each of the kernel's paths over an FP8 pool:
the conversion path (keys and values converted to the query's dtype: exact to it) and
the e4m3 matrix-unit path (decode_fp8_mma.py) with the query and the softmax weights as
one or two e4m3 terms. Each is compared with the float32 model's own prefill (torch
backend, float32 KV: perplexity, mean KL divergence of the next-token distributions,
top-1 agreement) and with the conversion path (the matrix unit's own share).

Runs the triton backend in Triton's interpreter on CPU (TRITON_INTERPRET=1 is set here
before triton is imported; the kernels compute what they compute on the GPU, with
e4m3 rounding done in software) or on a GPU with `--device cuda`: `python -m
bench.fp8_decode_quality [--tokens 128]`. Writes bench/results/fp8_decode_quality-<machine>.json.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any

if "--device" not in sys.argv or "cpu" in sys.argv:  # before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

from bench import record
from radixmesh.worker.attention.kernels.decode_attention import DecodeConfig
from radixmesh.worker.kvcache.fp8_kv import FP8
from radixmesh.worker.model import loader

# (name, decode launch): the interpreter runs any tile; the GPU's wgmma takes >= 64 keys.
PATHS: dict[str, dict[str, Any]] = {
    "converted": dict(fp8_mma=False),
    "e4m3 mma q1 w1": dict(fp8_mma=True, q_terms=1, w_terms=1),
    "e4m3 mma q2 w1": dict(fp8_mma=True, q_terms=2, w_terms=1),
    "e4m3 mma q2 w2": dict(fp8_mma=True, q_terms=2, w_terms=2),
}


def decode_log_probs(model: Any, text: list[int], launch: DecodeConfig | None) -> torch.Tensor:
    """Log-probabilities [S, vocab] of each next token, every position through a decode
    step over an FP8 pool (the triton backend with `launch`)."""
    from tests.worker.model.helpers import RaggedRunner

    runner = RaggedRunner(
        model, num_slots=len(text) + 8, max_requests=1, max_context=len(text) + 1,
        backend="triton", kv_dtype=FP8,
    )  # fmt: skip
    runner.attn.decode_launch = launch  # type: ignore[attr-defined]
    rows = [runner.step([(0, [token])])[0][-1] for token in text]
    return torch.stack(rows).float().log_softmax(-1)


def compare(lp: torch.Tensor, ref: torch.Tensor, text: list[int]) -> dict[str, float]:
    target = torch.tensor(text[1:], device=lp.device)
    nll, nll_ref = F.nll_loss(lp[:-1], target), F.nll_loss(ref[:-1], target)
    return {
        "perplexity": math.exp(float(nll)),
        "perplexity_vs_ref": math.exp(float(nll - nll_ref)) - 1,
        "kl": float(F.kl_div(lp, ref, log_target=True, reduction="batchmean")),
        "top1_agreement": float((lp.argmax(-1) == ref.argmax(-1)).float().mean()),
        "max_abs_logprob_diff": float(
            (lp[:-1].gather(1, target[:, None]) - ref[:-1].gather(1, target[:, None])).abs().max()
        ),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=128, help="tokens of the text scored")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--block-n", type=int, default=0, help="keys per tile (0: 16 on CPU, 64 on GPU)"
    )
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    from tests.worker.model import test_fp8_quality as quality

    arch = loader.load_arch_config("smollm2")
    weights = dict(loader.iter_weights("smollm2", arch, dtype=torch.float32))
    text = loader.load_tokenizer("smollm2").encode(quality.TEXT)[: args.tokens]
    model = quality.load_model(weights, None).to(args.device)
    from tests.worker.model.helpers import RaggedRunner

    ref_runner = RaggedRunner(
        model, num_slots=len(text) + 8, max_requests=1, max_context=len(text) + 1
    )
    ref = ref_runner.step([(0, text)])[0].float().log_softmax(-1)  # float32 KV, one prefill
    block_n = args.block_n or (64 if args.device.startswith("cuda") else 16)
    results: dict[str, Any] = {}
    converted = None
    for name, fields in PATHS.items():
        lp = decode_log_probs(model, text, DecodeConfig(block_n, 4, 2, **fields))
        converted = lp if converted is None else converted
        results[name] = {
            "vs_float32": compare(lp, ref, text),
            "vs_converted": compare(lp, converted, text),
        }
        r, c = results[name]["vs_float32"], results[name]["vs_converted"]
        print(
            f"{name:16} perplexity {r['perplexity']:.3f} ({r['perplexity_vs_ref']:+.2%} vs float32 "
            f"prefill), KL {r['kl']:.5f}, top-1 {r['top1_agreement']:.3f}; vs converted: "
            f"KL {c['kl']:.5f}, top-1 {c['top1_agreement']:.3f}, "
            f"max |dlogp| {c['max_abs_logprob_diff']:.4f}",
            flush=True,
        )
    record.write(
        "fp8_decode_quality", args, {"tokens": len(text), "block_n": block_n, "paths": results}
    )


if __name__ == "__main__":
    main()

"""Deterministic mode: unique outputs per prompt over trials, with the mode on and off.

In the spirit of SGLang's `python -m sglang.test.test_deterministic`, four checks, each run
on an engine with `deterministic=True` and one without, side by side:

- single: one prompt sent as a batch of itself at sizes 1..N (`--batch-sizes`); the
  outputs of every copy in every trial are counted (1: all equal).
- mixed: prompts of different lengths batched together in a shuffled order per trial;
  the most unique outputs any one prompt had.
- prefix: prompts sharing prefixes of `--prefix-lens` tokens with one long random
  prefix, each first run cold (cache flushed before each), then in trials after the
  whole prefix was cached, shuffled and batched; the most unique outputs of a prompt.
- cached: `--cached-prompts` greedy prompts as one batch after a flush (cold), then the
  same batch again with their prefixes cached; how many came out equal (SGLang's
  complaint: 9 of 24 on an H200 in bf16 before this mode).

An output is the greedy token ids (`tokens`) and, stricter, the ids with their logprobs'
bits (`exact`): a logprob that moves in its last bit shows a reduction that depends on
the batch even where no token flipped. Prompts are random token ids (seeded), which
near ties in dummy models (random weights) turn into a strong test.

`--throughput` also times one offline batch (`--throughput-prompts` prompts of
`--prompt-len` tokens, `--new-tokens` each) with the mode on and off in this process and
reports the ratio (target on the H200: >= 0.85x). For the offline benchmark's
workloads the same comparison is `python -m bench.offline` run twice, the second time
with `--deterministic` (and `--name deterministic`, so the records sit side by side).

    python -m bench.deterministic --model dummy:llama-3-8b --dtype bfloat16 --device cuda
    python -m bench.deterministic --model smollm2 --dtype float32 --trials 3 --modes single,prefix
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Sequence
from typing import Any

import torch

from bench import record
from radixmesh.worker.engine import Engine

MODES = ("single", "mixed", "prefix", "cached")
Output = tuple[tuple[int, ...], tuple[float, ...]]


def greedy(max_new_tokens: int) -> dict[str, Any]:
    return {
        "temperature": 0.0,
        "max_new_tokens": max_new_tokens,
        "ignore_eos": True,
        "return_logprob": True,
    }


def random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    """n token ids in [100, vocab): above the special tokens of the models at hand."""
    lo = min(100, vocab // 4)
    return [rng.randrange(lo, vocab) for _ in range(n)]


def _outputs(engine: Engine, prompts: Sequence[list[int]], params: dict[str, Any]) -> list[Output]:
    res = engine.generate(input_ids=list(prompts), sampling_params=params)
    assert isinstance(res, list)
    return [
        (tuple(o["output_ids"]), tuple(e[0] for e in o["meta_info"]["output_token_logprobs"]))
        for o in res
    ]


def _unique(outs: Sequence[Output]) -> dict[str, int]:
    return {"tokens": len({o[0] for o in outs}), "exact": len(set(outs))}


def _worst(per_prompt: Sequence[Sequence[Output]]) -> dict[str, int]:
    counts = [_unique(outs) for outs in per_prompt]
    return {k: max(c[k] for c in counts) for k in ("tokens", "exact")}


def _first_divergence(outs: Sequence[Output]) -> int | None:
    """The first output position whose logprob bits differ between any two runs (None:
    every run the same): 0 points at the prompt's prefill, later ones at decode steps."""
    width = min(len(o[1]) for o in outs)
    for i in range(width):
        if len({o[1][i] for o in outs}) > 1:
            return i
    return None if len(set(outs)) == 1 else width


def run_single(
    engine: Engine, vocab: int, batch_sizes: Sequence[int], trials: int, prompt_len: int, new: int
) -> dict[str, int]:
    prompt = random_ids(random.Random(1), prompt_len, vocab)
    outs: list[Output] = []
    for _ in range(trials):
        for bs in batch_sizes:
            engine.flush_cache()
            outs.extend(_outputs(engine, [prompt] * bs, greedy(new)))
    return _unique(outs)


def run_mixed(
    engine: Engine, vocab: int, lengths: Sequence[int], trials: int, new: int
) -> dict[str, int]:
    rng = random.Random(2)
    prompts = [random_ids(rng, n, vocab) for n in lengths]
    per_prompt: list[list[Output]] = [[] for _ in prompts]
    for t in range(trials):
        order = list(range(len(prompts)))
        random.Random(100 + t).shuffle(order)
        engine.flush_cache()
        outs = _outputs(engine, [prompts[i] for i in order], greedy(new))
        for i, o in zip(order, outs, strict=True):
            per_prompt[i].append(o)
    return _worst(per_prompt)


def run_prefix(
    engine: Engine, vocab: int, prefix_lens: Sequence[int], trials: int, new: int
) -> dict[str, Any]:
    rng = random.Random(3)
    prefix = random_ids(rng, max(prefix_lens), vocab)
    prompts = [prefix[:n] + random_ids(rng, 16, vocab) for n in prefix_lens]
    per_prompt: list[list[Output]] = [[] for _ in prompts]
    for i, p in enumerate(prompts):  # cold: nothing cached
        engine.flush_cache()
        per_prompt[i].extend(_outputs(engine, [p], greedy(new)))
    engine.flush_cache()
    _outputs(engine, [prefix], greedy(1))  # the whole prefix cached
    for t in range(trials):
        order = list(range(len(prompts)))
        random.Random(200 + t).shuffle(order)
        outs = _outputs(engine, [prompts[i] for i in order], greedy(new))
        for i, o in zip(order, outs, strict=True):
            per_prompt[i].append(o)
    per_prefix = {
        str(n): {**_unique(outs), "first_divergence": _first_divergence(outs)}
        for n, outs in zip(prefix_lens, per_prompt, strict=True)
    }
    return {**_worst(per_prompt), "per_prefix": per_prefix}


def run_cached(engine: Engine, vocab: int, n: int, prompt_len: int, new: int) -> dict[str, int]:
    rng = random.Random(4)
    prompts = [random_ids(rng, prompt_len + 7 * i, vocab) for i in range(n)]
    engine.flush_cache()
    cold = _outputs(engine, prompts, greedy(new))
    cached = _outputs(engine, prompts, greedy(new))
    return {
        "prompts": n,
        "equal_tokens": sum(a[0] == b[0] for a, b in zip(cold, cached, strict=True)),
        "equal_exact": sum(a == b for a, b in zip(cold, cached, strict=True)),
    }


def run_throughput(engine: Engine, vocab: int, n: int, prompt_len: int, new: int) -> float:
    """Output tokens per second of one offline batch (after a warm-up batch)."""
    rng = random.Random(5)
    prompts = [random_ids(rng, prompt_len, vocab) for _ in range(n)]
    params = {"temperature": 0.0, "max_new_tokens": new, "ignore_eos": True}
    engine.generate(input_ids=prompts[:2], sampling_params={**params, "max_new_tokens": 4})
    engine.flush_cache()
    t0 = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=params)
    return n * new / (time.perf_counter() - t0)


def run_engine(args: argparse.Namespace, deterministic: bool) -> dict[str, Any]:
    options: dict[str, Any] = {"dtype": args.dtype, "device": args.device}
    if args.max_num_batched_tokens is not None:
        options["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.kv_cache_tokens is not None:
        options["kv_cache_tokens"] = args.kv_cache_tokens
    engine = Engine(args.model, deterministic=deterministic, **options)
    vocab = engine.worker.arch.vocab_size
    modes = args.modes.split(",")
    out: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        if "single" in modes:
            out["single"] = run_single(
                engine, vocab, args.batch_sizes, args.trials, args.prompt_len, args.new_tokens
            )
        if "mixed" in modes:
            out["mixed"] = run_mixed(engine, vocab, args.mixed_lens, args.trials, args.new_tokens)
        if "prefix" in modes:
            out["prefix"] = run_prefix(
                engine, vocab, args.prefix_lens, args.trials, args.new_tokens
            )
        if "cached" in modes:
            out["cached"] = run_cached(
                engine, vocab, args.cached_prompts, args.prompt_len, args.new_tokens
            )
        out["checks_s"] = round(time.perf_counter() - t0, 2)
        if args.throughput:
            out["throughput_tok_s"] = run_throughput(
                engine, vocab, args.throughput_prompts, args.prompt_len, args.new_tokens
            )
    finally:
        engine.shutdown()
        del engine
        gc.collect()  # the next engine auto-sizes its pool from the free GPU memory
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def table(results: dict[str, dict[str, Any]]) -> str:
    """One line per check: the on and off figures side by side."""
    lines = [f"{'check':<24}{'on':>12}{'off':>12}"]
    on, off = results.get("on", {}), results.get("off", {})
    for mode in MODES:
        keys = ("equal_tokens", "equal_exact") if mode == "cached" else ("tokens", "exact")
        for k in keys:
            a = on.get(mode, {}).get(k, "-")
            b = off.get(mode, {}).get(k, "-")
            counted = on.get(mode) or off.get(mode)
            if mode == "cached" and counted:
                n = counted["prompts"]
                a, b = (f"{x}/{n}" if x != "-" else x for x in (a, b))
            label = f"{mode} {'unique ' if mode != 'cached' else ''}{k}"
            lines.append(f"{label:<24}{a!s:>12}{b!s:>12}")
    if "throughput_tok_s" in on and "throughput_tok_s" in off:
        ratio = on["throughput_tok_s"] / off["throughput_tok_s"]
        lines.append(
            f"{'throughput tok/s':<24}{on['throughput_tok_s']:>12.1f}"
            f"{off['throughput_tok_s']:>12.1f}  (on/off {ratio:.3f}x)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="dummy:tiny")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--deterministic", choices=["both", "on", "off"], default="both")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--batch-sizes", type=_ints, default=_ints("1,2,3,4,8,16,32"))
    ap.add_argument("--mixed-lens", type=_ints, default=_ints("8,30,64,100,250,511,700"))
    ap.add_argument("--prefix-lens", type=_ints, default=_ints("1,511,2048,4097"))
    ap.add_argument("--cached-prompts", type=int, default=24)
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--kv-cache-tokens", type=int, default=None)
    ap.add_argument("--throughput", action="store_true")
    ap.add_argument("--throughput-prompts", type=int, default=64)
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    flags = {"both": ("on", "off"), "on": ("on",), "off": ("off",)}[args.deterministic]
    results = {flag: run_engine(args, flag == "on") for flag in flags}
    print(table(results))
    if "on" in results and "off" in results and args.throughput:
        results["on_vs_off_throughput"] = {
            "ratio": results["on"]["throughput_tok_s"] / results["off"]["throughput_tok_s"]
        }
    record.write("deterministic", args, results, name=args.model.replace(":", "-"))


if __name__ == "__main__":
    main()

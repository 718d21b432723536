"""Speculative decoding: batch-1 speed on a copy-heavy set, the cost of a verify step,
and what leaving it on costs a large batch; each beside the same engine without it, in
one run.

Parts:
  copy    Batch 1, greedy, the copy-heavy set (bench/sets/copy_heavy.py): every task
          through an engine with `--speculative off`, then through one with each drafter
          named. Per task and overall: output tokens per second, the outputs' identity
          with the plain run's, and the mean tokens a verify step adds (accepted drafts
          + 1). Output tokens per second counts the whole request (prefill included), as
          a user sees it.
  verify  The cost of a verify step at batch 1: decode with drafts that are never
          accepted (k tokens after the last one that the model does not produce: one
          token per step, each step computing 1 + k), against plain decode (k = 0);
          ms per step and the ratio. With CUDA graphs the verify rows replay the decode
          graphs (one row per token).
  draft   Batch 1 with a draft model (`--draft-model`, k = `--k` drafts a step; the
          target's speculative_min_accept_rate 0, so it drafts every step) against plain
          decode in the same engine: ms per output token, verify steps and accepted
          drafts. With `dummy:` models (random weights) the drafts are rarely kept, so
          the figure is what a draft-model step costs: the draft's k steps (eager) and
          the verify; the speed-up at an acceptance follows from it.
  batch   A large batch with speculation on (adaptive: no drafts above
          speculative_max_batch_size) against off: output tokens per second, random
          prompts, ignore_eos.
  eagle   An EAGLE head's drafting per step, the step's requests as one batch against
          each request drafted alone, one after another: a random head of the target's
          shape (speculative/random_head.py), 1, 4 and 16 requests with
          `--eagle-history` positions each (random features), k = `--k`; each step
          first feeds one new position a request (an accepted token), then drafts;
          median ms of 30 steps.

CPU (the bundled model): `python -m bench.speculative --parts copy,verify`; the EAGLE
head's batching: `python -m bench.speculative --model dummy:tiny --parts eagle`
GPU: `python -m bench.speculative --model dummy:llama-3-8b --device cuda --dtype bfloat16
--parts verify,batch` (`--parts draft --draft-model dummy:llama-3.2-1b`: the draft-model
step)
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import random
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from bench import record
from bench.sets.copy_heavy import TASKS
from radixmesh.worker.engine import Engine
from radixmesh.worker.request import Request


def _engine(args: argparse.Namespace, **options: Any) -> Engine:
    kw: dict[str, Any] = {"device": args.device}
    if args.dtype:
        kw["dtype"] = args.dtype
    if args.overlap != "auto":
        kw["overlap_schedule"] = args.overlap == "on"
    return Engine(args.model, **kw, **options)


def _greedy(n: int, **extra: Any) -> dict[str, Any]:
    return {"temperature": 0.0, "max_new_tokens": n, **extra}


def copy_part(args: argparse.Namespace) -> dict[str, Any]:
    methods = ["off", *args.drafters.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {}
    for method in methods:
        eng = _engine(args, speculative=method, speculative_tokens=args.k)
        prompts = [
            eng.tokenizer.encode_chat([{"role": "user", "content": t.prompt}]) for t in TASKS
        ]
        eng.generate(input_ids=prompts[0], sampling_params=_greedy(8))  # warm-up
        rows = []
        for task, ids in zip(TASKS, prompts, strict=True):
            t0 = time.perf_counter()
            out = eng.generate(input_ids=ids, sampling_params=_greedy(args.max_new_tokens))
            wall = time.perf_counter() - t0
            assert isinstance(out, dict)
            meta = out["meta_info"]
            steps = meta.get("spec_verify_ct", 0)
            rows.append(
                {
                    "kind": task.kind,
                    "prompt_tokens": len(ids),
                    "output_tokens": meta["completion_tokens"],
                    "wall_s": wall,
                    "tok_per_s": meta["completion_tokens"] / wall,
                    "output_ids": out["output_ids"],
                    "verify_steps": steps,
                    "accepted_tokens": meta.get("spec_accepted_tokens", 0),
                }
            )
        eng.shutdown()
        runs[method] = rows
    base = runs["off"]
    table: dict[str, Any] = {}
    print(f"{'method':<8} {'tok/s':>8} {'speedup':>8} {'identical':>10} {'accept len':>10}")
    for method, rows in runs.items():
        tokens = sum(r["output_tokens"] for r in rows)
        wall = sum(r["wall_s"] for r in rows)
        same = sum(r["output_ids"] == b["output_ids"] for r, b in zip(rows, base, strict=True))
        steps = sum(r["verify_steps"] for r in rows)
        accepted = sum(r["accepted_tokens"] for r in rows)
        per_step = (accepted + steps) / steps if steps else None
        speedup = (tokens / wall) / (
            sum(b["output_tokens"] for b in base) / sum(b["wall_s"] for b in base)
        )
        table[method] = {
            "output_tokens": tokens,
            "wall_s": wall,
            "tok_per_s": tokens / wall,
            "speedup": speedup,
            "identical_outputs": same,
            "tasks": len(rows),
            "verify_steps": steps,
            "mean_accept_length": per_step,
            "per_task": [{k: v for k, v in r.items() if k != "output_ids"} for r in rows],
        }
        acc = f"{per_step:.2f}" if per_step else "-"
        print(
            f"{method:<8} {tokens / wall:>8.1f} {speedup:>7.2f}x {same:>5}/{len(rows):<4} {acc:>10}"
        )
    return table


class NeverAccepted:
    """k drafts the model will not produce: a token id above any it samples here (the
    last id of the vocabulary, a padding or rare token), so each step verifies k and
    keeps none."""

    def __init__(self, token: int) -> None:
        self.token = token

    def propose(self, req: Request, k: int) -> list[int]:
        return [self.token] * k


def verify_part(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ks = [int(k) for k in args.verify_ks.split(",")]
    eng = _engine(
        args, speculative="ngram", speculative_tokens=max(ks), speculative_min_accept_rate=0.0
    )
    spec = eng.worker.scheduler.speculator
    assert spec is not None
    vocab = eng.worker.arch.vocab_size
    rng = random.Random(0)
    prompt = [rng.randrange(100, vocab - 100) for _ in range(args.verify_prompt)]
    n = args.verify_tokens
    print(f"{'k':>3} {'ms/step':>9} {'ratio':>7}")
    base = None
    spec.drafter = NeverAccepted(vocab - 1)
    for k in [0, *ks]:
        # Between requests the engine is idle: the speculator's config is swapped for k.
        spec.config = dataclasses.replace(spec.config, speculative_tokens=max(k, 1))
        params = _greedy(n, ignore_eos=True, speculative=k > 0)
        eng.generate(input_ids=prompt, sampling_params=_greedy(16, ignore_eos=True))  # warm
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res = eng.generate(input_ids=prompt, sampling_params=params)
            times.append(time.perf_counter() - t0)
            assert isinstance(res, dict)
        # Steps: one per output token (drafts are never kept); the prefill is one more.
        ms = statistics.median(times) * 1e3 / n
        base = ms if k == 0 else base
        ratio = ms / base if base else 1.0
        out[str(k)] = {"ms_per_step": ms, "ratio": ratio, "times_s": times}
        print(f"{k:>3} {ms:>9.3f} {ratio:>6.2f}x")
    eng.shutdown()
    return out


def draft_part(args: argparse.Namespace) -> dict[str, Any]:
    eng = _engine(
        args,
        speculative="draft",
        speculative_draft_model=args.draft_model,
        speculative_tokens=args.k,
        speculative_min_accept_rate=0.0,
    )
    vocab = eng.worker.arch.vocab_size
    rng = random.Random(0)
    prompt = [rng.randrange(100, vocab - 100) for _ in range(args.verify_prompt)]
    n = args.verify_tokens
    out: dict[str, Any] = {"draft_model": args.draft_model, "k": args.k}
    print(f"{'run':>6} {'ms/token':>9} {'verify steps':>13} {'accepted':>9}")
    for name, drafting in (("plain", False), ("draft", True)):
        params = _greedy(n, ignore_eos=True, speculative=drafting)
        eng.generate(input_ids=prompt, sampling_params=_greedy(16, ignore_eos=True))  # warm
        times, meta = [], {}
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res = eng.generate(input_ids=prompt, sampling_params=params)
            times.append(time.perf_counter() - t0)
            assert isinstance(res, dict)
            meta = res["meta_info"]
        ms = statistics.median(times) * 1e3 / n
        steps, kept = meta.get("spec_verify_ct", 0), meta.get("spec_accepted_tokens", 0)
        out[name] = {
            "ms_per_token": ms,
            "times_s": times,
            "verify_steps": steps,
            "accepted_tokens": kept,
        }
        print(f"{name:>6} {ms:>9.3f} {steps:>13} {kept:>9}")
    out["ratio"] = out["draft"]["ms_per_token"] / out["plain"]["ms_per_token"]
    # One verify step's cost in plain steps: ms per step over ms per plain token.
    steps = out["draft"]["verify_steps"]
    out["step_vs_plain"] = (
        out["draft"]["ms_per_token"] * n / steps / out["plain"]["ms_per_token"] if steps else None
    )
    print(f"draft / plain per token: {out['ratio']:.2f}x")
    eng.shutdown()
    return out


def _batch_throughput(args: argparse.Namespace, method: str) -> float:
    """Output tokens per second of one engine (`method`) on the batch workload."""
    eng = _engine(args, speculative=method)
    rng = random.Random(0)
    vocab = eng.worker.arch.vocab_size
    prompts = [
        [rng.randrange(100, vocab - 100) for _ in range(args.batch_prompt)]
        for _ in range(args.batch)
    ]
    eng.generate(input_ids=prompts[:8], sampling_params=_greedy(8, ignore_eos=True))
    t0 = time.perf_counter()
    eng.generate(input_ids=prompts, sampling_params=_greedy(args.batch_new_tokens, ignore_eos=True))
    wall = time.perf_counter() - t0
    eng.shutdown()
    return args.batch * args.batch_new_tokens / wall


def batch_part(args: argparse.Namespace) -> dict[str, Any]:
    # Each engine in a process of its own: on a GPU the first engine's memory is not all
    # back before the process ends, and the second would size its KV pool smaller.
    ctx = multiprocessing.get_context("spawn")
    res: dict[str, float] = {}
    for method in ("off", "ngram"):
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            res[method] = pool.submit(_batch_throughput, args, method).result()
    out = {"tok_per_s": res, "ratio": res["ngram"] / res["off"], "batch": args.batch}
    print(
        f"batch {args.batch}: off {res['off']:.0f} tok/s, ngram {res['ngram']:.0f} tok/s "
        f"({out['ratio']:.3f}x)"
    )
    return out


def eagle_part(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile
    from pathlib import Path

    import torch

    from radixmesh.sampling_params import SamplingParams
    from radixmesh.worker.model.loader import load_arch_config
    from radixmesh.worker.speculative.eagle import EagleDrafter
    from radixmesh.worker.speculative.random_head import write_head

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        head = write_head(Path(tmp) / "head", load_arch_config(args.model))
        eng = _engine(
            args, speculative="eagle", speculative_draft_model=str(head),
            speculative_max_batch_size=16,
        )  # fmt: skip
        spec = eng.worker.scheduler.speculator
        assert spec is not None and isinstance(spec.drafter, EagleDrafter)
        head_, target = spec.drafter.head, spec.drafter.target
        hidden = eng.worker.arch.hidden_size
        device = next(target.parameters()).device
        dtype = next(head_.parameters()).dtype
        gen = torch.Generator().manual_seed(0)
        for batch in (1, 4, 16):
            figures: dict[str, Any] = {"requests": batch}
            for mode in ("batched", "one_by_one"):
                drafter = EagleDrafter(head_, target)
                reqs = [
                    Request(rid=f"r{i}", prompt_ids=[(7 * i + j) % 500 + 3 for j in
                            range(args.eagle_history + 1)], params=SamplingParams())
                    for i in range(batch)
                ]  # fmt: skip

                def feed(req: Request, start: int, n: int, d: EagleDrafter = drafter) -> None:
                    f = torch.randn(n, hidden, generator=gen).to(device=device, dtype=dtype)
                    d.observe(req, start, f)

                for req in reqs:
                    req.num_computed_tokens = len(req.token_ids) - 1
                    feed(req, 0, len(req.token_ids) - 1)
                times = []
                for step in range(31):
                    if step:
                        for req in reqs:
                            n = len(req.token_ids)
                            req.token_ids.append(5)
                            req.num_computed_tokens = n
                            feed(req, n - 1, 1)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    if mode == "batched":
                        drafter.propose_all([(r, args.k) for r in reqs])
                    else:
                        for r in reqs:
                            drafter.propose(r, args.k)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    if step:  # the first step feeds the whole history
                        times.append((time.perf_counter() - t0) * 1e3)
                figures[f"{mode}_ms"] = statistics.median(times)
            figures["one_by_one_over_batched"] = figures["one_by_one_ms"] / figures["batched_ms"]
            rows.append(figures)
            print(f"eagle: {batch} requests: batched {figures['batched_ms']:.2f} ms, one by "
                  f"one {figures['one_by_one_ms']:.2f} ms a step "
                  f"({figures['one_by_one_over_batched']:.2f}x)", flush=True)  # fmt: skip
        eng.shutdown()
    return {"k": args.k, "history": args.eagle_history, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--parts", default="copy,verify")
    ap.add_argument(
        "--overlap",
        choices=("auto", "on", "off"),
        default="auto",
        help="the overlap scheduler (auto: the device's default); off makes plain decode "
        "as synchronous as a drafting step, so the verify part then times the rows alone",
    )
    ap.add_argument("--drafters", default="ngram,radix", help="copy: drafters beside off")
    ap.add_argument("--k", type=int, default=4, help="copy, draft: draft tokens per step")
    ap.add_argument("--draft-model", default="smollm2", help="draft: the draft model")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--verify-ks", default="4,8")
    ap.add_argument("--verify-prompt", type=int, default=512)
    ap.add_argument("--verify-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batch-prompt", type=int, default=512)
    ap.add_argument("--batch-new-tokens", type=int, default=256)
    ap.add_argument("--eagle-history", type=int, default=256, help="eagle: positions each")
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    figures: dict[str, Any] = {}
    parts = args.parts.split(",")
    if "copy" in parts:
        figures["copy"] = copy_part(args)
    if "verify" in parts:
        figures["verify"] = verify_part(args)
    if "draft" in parts:
        figures["draft"] = draft_part(args)
    if "batch" in parts:
        figures["batch"] = batch_part(args)
    if "eagle" in parts:
        figures["eagle"] = eagle_part(args)
    record.write("speculative", args, figures)


if __name__ == "__main__":
    main()

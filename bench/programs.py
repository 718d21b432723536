"""The frontend language's programs at larger counts, radix cache on vs off.

Programs (the shapes of the SGLang paper and tests/lang/): multi-turn chat, fork/join tip
suggestion (5 branches), 2-level tree of thought, an LLM judge over 3 dimensions,
few-shot select, regex extraction, and a shared-template batch. Each runs `--count`
times through `run_batch` on the in-process engine (or, with `--backend cluster`, on a
local cluster of `--workers` workers through `sgl.Runtime`), once with the radix cache
and once without (`disable_radix_cache=True`), greedy, on the same weights; on a cluster
also with the cache but with program-aware routing off (`cache_on_untagged`: the
requests carry no program ids). Each program is warmed up (2 programs) right before its
timed run.

Reports programs/s and the cache hit rate (cached prompt tokens / prompt tokens) per
program and the on/off ratios; writes JSON to bench/results/programs[-cluster]-<machine>.json.
Run: `.venv/bin/python -m bench.programs [--count 16] [--programs tips,judge]
[--backend cluster --workers 2]`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import radixmesh as sgl
from bench import record
from radixmesh.lang.function import SglFunction
from radixmesh.worker.engine import Engine

TOPICS = ["sleep", "tea", "running", "reading", "cooking", "music", "travel", "gardening"]
COUNTRIES = ["France", "Germany", "Italy", "Spain", "Japan", "China", "Egypt", "Peru"]


@sgl.function
def multi_turn(s, i):
    s += sgl.system("You are a concise assistant. Answer in one sentence.")
    s += sgl.user(f"What is the capital of {COUNTRIES[i % 8]}?")
    s += sgl.assistant(sgl.gen("a1", max_tokens=16))
    s += sgl.user("What is it famous for?")
    s += sgl.assistant(sgl.gen("a2", max_tokens=16))


@sgl.function
def tips(s, i):
    s += "Here are five tips for a good life: sleep well, drink water, walk daily, "
    s += f"eat vegetables, call friends. Topic: {TOPICS[i % 8]}.\n\n"
    forks = s.fork(5)
    for j, f in enumerate(forks):
        f += f"Expand tip {j + 1} into one sentence:" + sgl.gen("tip", max_tokens=12)
    forks.join()
    s += "Summary:" + sgl.gen("summary", max_tokens=8)


@sgl.function
def tree_of_thought(s, i):
    s += f"Question: how many legs do {i + 2} cats have? Think in steps.\n"
    for a, first in enumerate(s.fork(2)):
        first += f"Approach {a + 1}:" + sgl.gen("plan", max_tokens=8) + "\n"
        for b, second in enumerate(first.fork(2)):
            second += f"Step {b + 1}:" + sgl.gen("step", max_tokens=8)
    s += "Answer:" + sgl.gen("answer", max_tokens=6)


@sgl.function
def judge(s, i):
    s += "You are an essay judge. Rate each dimension of the essay as good or bad.\n"
    s += f"Essay: My favourite hobby is {TOPICS[i % 8]}. It makes me happy every day.\n"
    forks = s.fork(3)
    for f, dim in zip(forks, ["clarity", "grammar", "relevance"], strict=True):
        f += f"{dim}:" + sgl.select("v", choices=[" good", " bad"])
    forks.join()


FEW_SHOT = "".join(
    f"Q: What is the capital of {c}? A: {a}\n"
    for c, a in [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Peru", "Lima")]
)


@sgl.function
def few_shot_select(s, i):
    s += FEW_SHOT + f"Q: What is the capital of {COUNTRIES[i % 8]}? A:"
    s += sgl.select("city", choices=[" Berlin", " Tokyo", " Cairo", " Beijing", " Paris"])


@sgl.function
def regex_extraction(s, i):
    s += "Extract the phone number from the text.\n"
    s += f"Text: Call office {i} at 555-{1000 + i} before noon.\nPhone: "
    s += sgl.gen("phone", regex=r"[0-9]{3}-[0-9]{4}", max_tokens=10)


@sgl.function
def batch_template(s, i):
    s += sgl.system(
        "You are a geography tutor. You answer every question in exactly one short sentence "
        "and you never add anything else to your answer."
    )
    s += sgl.user(f"Name one river in {COUNTRIES[i % 8]}.")
    s += sgl.assistant(sgl.gen("river", max_tokens=12))


PROGRAMS: dict[str, SglFunction] = {
    "multi_turn": multi_turn,
    "tips_fork5": tips,
    "tree_of_thought": tree_of_thought,
    "judge_3": judge,
    "few_shot_select": few_shot_select,
    "regex_extraction": regex_extraction,
    "batch_template": batch_template,
}


Counts = Callable[[], tuple[int, int]]  # (prompt tokens, cached prompt tokens) so far


def run(counts: Counts, name: str, count: int, flush: Callable[[], object]) -> dict[str, Any]:
    program = PROGRAMS[name]
    flush()
    prompt_before, hits_before = counts()
    start = time.perf_counter()
    states = program.run_batch([{"i": i} for i in range(count)], temperature=0)
    seconds = time.perf_counter() - start
    errors = [str(st.error()) for st in states if st.error() is not None]
    prompt_after, hits_after = counts()
    prompt = prompt_after - prompt_before
    hits = hits_after - hits_before
    return {
        "programs": count,
        "seconds": round(seconds, 3),
        "programs_per_s": round(count / seconds, 3),
        "prompt_tokens": prompt,
        "cached_tokens": hits,
        "cache_hit_rate": round(hits / prompt, 4) if prompt else 0.0,
        "errors": errors[:3],
    }


def warm_grammars(addresses: list[str], api_key: str | None) -> None:
    """Build each worker's grammar backend now: an engine builds it on its first
    constrained request (~0.5-1 s of CPU), and the router decides which worker that is,
    so one mode's timed run would pay it on a worker the warm-up never reached."""
    from radixmesh.client import Client

    for address in addresses:
        with Client(address, service="worker", api_key=api_key) as client:
            client.generate("Phone: ", {"max_new_tokens": 2, "regex": "[0-9]+"})


def open_backend(
    args: argparse.Namespace, disable: bool, program_hints: bool = True
) -> tuple[Any, Counts, Any]:
    """The backend for one mode, its token counts, and what to close afterwards."""
    options = {"device": args.device, "dtype": args.dtype, "disable_radix_cache": disable}
    if args.backend == "cluster":
        runtime = sgl.Runtime(model=args.model, workers=args.workers, **options)
        assert runtime.endpoint is not None
        runtime.endpoint.program_hints = program_hints
        warm_grammars(runtime.worker_addresses, runtime.worker_api_key)
        usage = runtime.endpoint.usage

        def cluster_counts() -> tuple[int, int]:
            total = usage.snapshot()["total"]
            return total.prompt_tokens, total.cached_tokens

        return runtime, cluster_counts, runtime
    engine = Engine(args.model, **options)

    def engine_counts() -> tuple[int, int]:
        stats = engine.get_stats()
        return stats.prompt_tokens, stats.cache_hit_tokens

    return engine, engine_counts, engine


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument(
        "--backend",
        choices=["engine", "cluster"],
        default="engine",
        help="engine: in-process; cluster: sgl.Runtime (router + --workers local workers)",
    )
    ap.add_argument("--workers", type=int, default=2, help="workers of --backend cluster")
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    names = args.programs.split(",")
    results: dict[str, dict[str, Any]] = {name: {} for name in names}
    modes = [("cache_on", False, True), ("cache_off", True, True)]
    if args.backend == "cluster":  # program-aware routing off: the router sees no program ids
        modes.insert(1, ("cache_on_untagged", False, False))
    for mode, disable, hints in modes:
        backend, counts, owner = open_backend(args, disable, hints)
        sgl.set_default_backend(backend)
        for name in names:
            # Warm-up with this program first: its one-time costs (the grammar backend
            # is built on an engine's first constrained request, ~0.5-1 s of CPU) must
            # not land in the timed run of whichever program comes first.
            run(counts, name, 2, sgl.flush_cache)
            results[name][mode] = r = run(counts, name, args.count, sgl.flush_cache)
            print(
                f"{mode:9s} {name:18s} {r['programs_per_s']:7.2f} programs/s  "
                f"hit rate {r['cache_hit_rate']:.2f}  errors {len(r['errors'])}",
                flush=True,
            )
        owner.shutdown()
    for r in results.values():
        on, off = r["cache_on"], r["cache_off"]
        r["speedup_cache_on_vs_off"] = round(on["programs_per_s"] / off["programs_per_s"], 3)
        if "cache_on_untagged" in r:
            untagged = r["cache_on_untagged"]
            r["cached_tokens_tagged_vs_untagged"] = [on["cached_tokens"], untagged["cached_tokens"]]
    kind = "cluster" if args.backend == "cluster" else None
    record.write("programs", args, {"results": results}, name=kind)
    for name, r in results.items():
        line = f"{name:18s} cache on/off: {r['speedup_cache_on_vs_off']:.2f}x"
        if "cached_tokens_tagged_vs_untagged" in r:
            tagged, untagged = r["cached_tokens_tagged_vs_untagged"]
            line += f"  cached tokens with / without program ids: {tagged} / {untagged}"
        print(line)


if __name__ == "__main__":
    main()

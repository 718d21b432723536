"""JSON decoding with compressed-FSM jump-forward: on vs off (the SGLang paper's workload).

Workload: extract 5 fields of a short document into a fixed JSON template, for many
documents, constrained by a JSON schema (or the equivalent regex, `--constraint regex`),
greedy. The same engine runs the batch twice, jump-forward on then off (the radix cache is
flushed in between, the grammar is compiled before either run), and reports requests/s,
decode steps, and the share of output tokens that were forced (appended without a decode
step).

Mask overhead: the time to fill one bitmask for B constrained rows and apply it to
`[B, V]` logits, against one unconstrained decode step at batch B.

Prints a summary and writes JSON to bench/results/ (machine, date, versions, figures).
CPU:  `.venv/bin/python -m bench.json_decode`
GPU:  `python -m bench.json_decode --model dummy:llama-3-8b --documents 256 \
          --max-running-requests 64 --max-new-tokens 400 --kv-cache-bytes 16000000000`
(dummy models use the byte tokenizer: random weights, but every output obeys the schema.)
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import random
import statistics
import time
from typing import Any

import torch

from bench import record
from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.batch import Batch, ScheduledRequest
from radixmesh.worker.constrained.bitmask import TokenBitmask
from radixmesh.worker.engine import Engine
from radixmesh.worker.request import Request

NAME = {"type": "string", "maxLength": 24}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "full_name_of_the_person": NAME,
        "city_where_the_person_lives": NAME,
        "age_of_the_person_in_years": {"type": "integer", "minimum": 0, "maximum": 120},
        "profession_of_the_person": NAME,
        "favorite_programming_language": NAME,
    },
    "required": [
        "full_name_of_the_person",
        "city_where_the_person_lives",
        "age_of_the_person_in_years",
        "profession_of_the_person",
        "favorite_programming_language",
    ],
    "additionalProperties": False,
}
_STR = r'"[A-Za-z ]{1,24}"'
REGEX = (
    r'\{"full_name_of_the_person": '
    + _STR
    + r', "city_where_the_person_lives": '
    + _STR
    + r', "age_of_the_person_in_years": (0|[1-9][0-9]?), "profession_of_the_person": '
    + _STR
    + r', "favorite_programming_language": '
    + _STR
    + r"\}"
)

FIRST = ["Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Jade"]
LAST = ["Smith", "Rossi", "Wang", "Cohen", "Okafor", "Haddad", "Novak", "Sato", "Petrov", "Lee"]
CITIES = ["Paris", "Lagos", "Osaka", "Lima", "Oslo", "Cairo", "Quito", "Seoul", "Perth", "Rome"]
JOBS = ["nurse", "pilot", "chef", "teacher", "plumber", "lawyer", "farmer", "architect"]
LANGS = ["Python", "Rust", "Go", "Haskell", "Java", "OCaml", "Kotlin", "Zig"]


def documents(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
        docs.append(
            f"{name} is a {rng.randint(20, 70)}-year-old {rng.choice(JOBS)} living in "
            f"{rng.choice(CITIES)}. In their spare time they write {rng.choice(LANGS)} code."
        )
    return docs


def prompts(engine: Engine, docs: list[str]) -> list[str]:
    return [
        engine.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Extract the person's details as JSON.\n\n{d}"}]
        )
        for d in docs
    ]


def run(
    engine: Engine,
    texts: list[str],
    params: dict[str, Any],
    jump: bool,
    profile: str | None = None,
) -> dict[str, Any]:
    """One pass over `texts`; with `profile`, cProfile stats of the scheduler thread's
    steps are written to that path (`python -m pstats PATH`)."""
    engine.worker.grammars.jump_forward = jump
    assert engine.flush_cache()
    steps0 = engine.get_stats().num_steps
    runner = engine.worker.runner
    shaped0 = getattr(runner, "num_decode_shaped_steps", 0)
    graphs = runner.decode_graphs
    replays0 = graphs.num_replays if graphs is not None else 0
    sched = engine.worker.scheduler
    prof = cProfile.Profile() if profile else None
    if prof is not None:
        step = sched.step

        def profiled_step() -> Any:  # runs on the scheduler thread
            assert prof is not None
            prof.enable()
            try:
                return step()
            finally:
                prof.disable()

        sched.step = profiled_step  # type: ignore[method-assign]
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        outs = engine.generate(texts, [params] * len(texts))
    finally:
        if prof is not None:
            del sched.step  # back to the class's method
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0  # all of the process's threads: less noisy when shared
    if prof is not None and profile:
        prof.dump_stats(profile)
    assert isinstance(outs, list)
    steps = engine.get_stats().num_steps - steps0
    metas = [o["meta_info"] for o in outs]
    completion = sum(m["completion_tokens"] for m in metas)
    forced = sum(m["forced_tokens"] for m in metas)
    valid = 0
    for o in outs:
        try:
            obj = json.loads(o["text"])
            valid += set(obj) == set(SCHEMA["required"])
        except json.JSONDecodeError:
            pass
    return {
        "jump_forward": jump,
        "requests": len(texts),
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "requests_per_s": len(texts) / elapsed,
        "output_tokens_per_s": completion / elapsed,
        "engine_steps": steps,
        # Steps whose forced tokens ran as decode rows, and decode CUDA graph replays.
        "decode_shaped_steps": getattr(runner, "num_decode_shaped_steps", 0) - shaped0,
        "graph_replays": (graphs.num_replays if graphs is not None else 0) - replays0,
        "completion_tokens": completion,
        "forced_tokens": forced,
        "forced_share": forced / completion if completion else 0.0,
        "decode_steps_per_request": sum(m["decode_steps"] for m in metas) / len(metas),
        "valid_json": valid,
        "example": outs[0]["text"],
    }


def _rate(r: dict[str, Any]) -> float:
    return float(r["requests_per_s"])


def mask_overhead(
    engine: Engine, texts: list[str], constraint: dict[str, Any], batch: int, repeats: int
) -> dict[str, Any]:
    """Fill + apply of one bitmask for `batch` rows vs one unconstrained decode step."""
    texts = (texts * (batch // len(texts) + 1))[:batch]
    mgr = engine.worker.grammars
    params = SamplingParams(**constraint)
    mgr.validate(params)
    reqs = [Request(rid=f"m{i}", prompt_ids=[1], params=params) for i in range(batch)]
    for r in reqs:
        mgr.attach(r)
        assert not mgr.pending(r)
    vocab = engine.worker.arch.vocab_size
    device = engine.worker.device
    logits = torch.randn(batch, vocab, device=device)
    fill = apply = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        bits = mgr.fill_bitmask(reqs)
        t1 = time.perf_counter()
        TokenBitmask(bits, list(range(batch))).apply_(logits)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        fill += t1 - t0
        apply += t2 - t1
    plain = {"temperature": 0, "ignore_eos": True}
    engine.generate(texts, {**plain, "max_new_tokens": 1})  # warm-up
    assert engine.flush_cache()
    t0 = time.perf_counter()
    engine.generate(texts, {**plain, "max_new_tokens": 1})
    prefill = time.perf_counter() - t0
    assert engine.flush_cache()
    new = 17
    t0 = time.perf_counter()
    engine.generate(texts, {**plain, "max_new_tokens": new})
    step = (time.perf_counter() - t0 - prefill) / (new - 1)
    per_step = (fill + apply) / repeats
    return {
        "batch": batch,
        "fill_ms": 1e3 * fill / repeats,
        "apply_ms": 1e3 * apply / repeats,
        "unconstrained_decode_step_ms": 1e3 * step,
        "overhead_share": per_step / step,
    }


def mask_overhead_in_step(
    engine: Engine, texts: list[str], constraint: dict[str, Any], batch: int, repeats: int
) -> dict[str, Any]:
    """What the mask adds to a real decode step: `ModelRunner.forward` (CUDA graph, logits,
    sampler) over `batch` decode rows, all constrained vs the same rows unconstrained.

    The rows sit inside the first string value of the template, at different depths. On
    CUDA the bitmask is filled while the GPU runs the forward, so this is the exposed cost;
    `mask_overhead` above times fill and apply on their own. Runs while the engine is idle,
    on KV slots and table rows it takes and gives back.
    """
    w, tok = engine.worker, engine.tokenizer
    params = SamplingParams(temperature=0, max_new_tokens=64, **constraint)
    w.grammars.validate(params)
    reqs, held = [], []
    for i in range(batch):
        prompt = tok.encode(texts[i % len(texts)])
        out = tok.encode('{"full_name_of_the_person": "') + tok.encode("Alice Smith"[: i % 8])
        req = Request(rid=f"s{i}", prompt_ids=prompt, params=params)
        req.token_ids.extend(out)
        w.grammars.attach(req)
        assert not w.grammars.pending(req) and req.grammar and req.grammar.matcher
        assert all(req.grammar.matcher.accept_token(t) for t in out)
        row = w.req_table.alloc_row()
        slots = w.allocator.alloc(len(req.token_ids))
        assert row is not None and slots is not None
        w.req_table.write(row, 0, slots)
        req.row, req.num_computed_tokens = row, len(req.token_ids) - 1
        reqs.append(req)
        held.append(slots)
    last = torch.stack([s[-1].cpu() for s in held])
    step = Batch(items=[ScheduledRequest(r, 1) for r in reqs], out_cache_loc=last)
    grammars = [r.grammar for r in reqs]
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        for k in range(2 * repeats + 2):
            constrained = k % 2 == 0
            for r, g in zip(reqs, grammars, strict=True):
                r.grammar = g if constrained else None
            t0 = time.perf_counter()
            ids = w.runner.forward(step).next_token_ids()  # the step's tokens, read back
            times[constrained].append(time.perf_counter() - t0)
            assert all(t is not None for t in ids)
    finally:
        for r, slots in zip(reqs, held, strict=True):
            w.allocator.free(slots)
            assert r.row is not None
            w.req_table.free_row(r.row)
    on = statistics.median(times[True][1:])  # the first of each warms up
    off = statistics.median(times[False][1:])
    return {
        "batch": batch,
        "runner_forward_constrained_ms": 1e3 * on,
        "runner_forward_unconstrained_ms": 1e3 * off,
        "exposed_overhead_ms": 1e3 * (on - off),
        "share_of_runner_forward": (on - off) / off,
    }


def print_mask(overhead: dict[str, Any], in_step: dict[str, Any]) -> None:
    step_ms = overhead["unconstrained_decode_step_ms"]
    print(
        f"mask at batch {overhead['batch']}: fill {overhead['fill_ms']:.2f} ms + apply "
        f"{overhead['apply_ms']:.2f} ms vs decode step {step_ms:.1f} ms "
        f"({100 * overhead['overhead_share']:.1f}%)"
    )
    print(
        f"in a real step at batch {in_step['batch']}: runner forward "
        f"{in_step['runner_forward_constrained_ms']:.2f} ms constrained vs "
        f"{in_step['runner_forward_unconstrained_ms']:.2f} ms: exposed "
        f"{in_step['exposed_overhead_ms']:.2f} ms = "
        f"{100 * in_step['share_of_engine_decode_step']:.1f}% of an engine decode step"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--documents", type=int, default=32)
    ap.add_argument("--max-running-requests", type=int, default=32)
    ap.add_argument("--constraint", choices=["json_schema", "regex"], default="json_schema")
    ap.add_argument("--mask-batch", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--kv-cache-bytes", type=int, default=1 << 30, help="0: auto on CUDA")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--cuda-graph-max-batch-size", type=int, default=512, help="0: no graphs")
    ap.add_argument(
        "--jump-forward-decode-rows",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="forced tokens as decode rows (graph-replayed; CUDA graphs only)",
    )
    record.add_output_arguments(ap)
    ap.add_argument(
        "--profile",
        default=None,
        metavar="PREFIX",
        help="write cProfile stats of the scheduler's steps to PREFIX-on.prof / -off.prof",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run on/off alternately this many times and report the fastest of each "
        "(a shared machine)",
    )
    ap.add_argument("--skip-mask", action="store_true", help="skip the two mask-overhead runs")
    args = ap.parse_args(argv)

    load_before = os.getloadavg()
    options: dict[str, Any] = {"kv_cache_bytes": args.kv_cache_bytes} if args.kv_cache_bytes else {}
    engine = Engine(
        args.model,
        device=args.device,
        dtype=args.dtype,
        max_running_requests=max(args.max_running_requests, args.mask_batch),
        max_num_batched_tokens=args.max_num_batched_tokens,
        cuda_graph_max_batch_size=args.cuda_graph_max_batch_size,
        jump_forward_decode_rows=args.jump_forward_decode_rows,
        **options,
    )
    try:
        text = json.dumps(SCHEMA) if args.constraint == "json_schema" else REGEX
        constraint = {args.constraint: text}
        params = {"temperature": 0, "max_new_tokens": args.max_new_tokens, **constraint}
        texts = prompts(engine, documents(args.documents))
        engine.generate(texts[:2], params)  # compile the grammar, warm up
        # Both modes once over a batch-sized slice: on CUDA the first steps of new shapes
        # compile Triton kernels (~0.1 s each), which a timed run must not pay (seen on the
        # H200: one eager admission step of 1.4 s in the first jump-forward run).
        warm = texts[: args.max_running_requests]
        for jump in (True, False):
            engine.worker.grammars.jump_forward = jump
            engine.generate(warm, [params] * len(warm))
        prof = args.profile
        on = run(engine, texts, params, jump=True, profile=prof and f"{prof}-on.prof")
        off = run(engine, texts, params, jump=False, profile=prof and f"{prof}-off.prof")
        for _ in range(args.repeats - 1):  # alternate on/off; keep the fastest of each
            on = max(on, run(engine, texts, params, jump=True), key=_rate)
            off = max(off, run(engine, texts, params, jump=False), key=_rate)
        overhead: dict[str, Any] = {}
        in_step: dict[str, Any] = {}
        if not args.skip_mask:
            overhead = mask_overhead(engine, texts, constraint, args.mask_batch, repeats=20)
            in_step = mask_overhead_in_step(engine, texts, constraint, args.mask_batch, repeats=20)
            in_step["share_of_engine_decode_step"] = (
                in_step["exposed_overhead_ms"] / overhead["unconstrained_decode_step_ms"]
            )
    finally:
        engine.shutdown()

    report = {
        "load_average_before_after": [load_before[0], os.getloadavg()[0]],
        "dtype": str(engine.worker.dtype),
        "jump_forward_on": on,
        "jump_forward_off": off,
        "throughput_ratio_on_vs_off": on["requests_per_s"] / off["requests_per_s"],
        "cpu_time_ratio_off_vs_on": off["cpu_seconds"] / on["cpu_seconds"],
        "engine_steps_ratio_off_vs_on": off["engine_steps"] / max(on["engine_steps"], 1),
        "mask_overhead": overhead,
        "mask_overhead_in_step": in_step,
    }
    for r in (on, off):
        print(
            f"jump_forward={r['jump_forward']!s:5}  {r['requests_per_s']:.2f} req/s  "
            f"steps={r['engine_steps']}  decode steps/req={r['decode_steps_per_request']:.1f}  "
            f"forced share={r['forced_share']:.2f}  valid={r['valid_json']}/{r['requests']}  "
            f"decode-shaped steps={r['decode_shaped_steps']}  graph replays={r['graph_replays']}"
        )
    print(
        f"throughput ratio on/off: {report['throughput_ratio_on_vs_off']:.2f}x  "
        f"(process CPU time off/on: {report['cpu_time_ratio_off_vs_on']:.2f}x)"
    )
    print(
        "ms per engine step: "
        f"on {1e3 * on['seconds'] / max(on['engine_steps'], 1):.2f}, "
        f"off {1e3 * off['seconds'] / max(off['engine_steps'], 1):.2f}"
    )
    if overhead:
        print_mask(overhead, in_step)
    print(f"example: {on['example']}")
    record.write("json_decode", args, report)


if __name__ == "__main__":
    main()

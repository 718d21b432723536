"""The README's results table, generated from `bench/results/` (one source per figure).

    python -m bench.readme_table          # print the table
    python -m bench.readme_table --write  # replace the README's table with it

Each row names its result file and how its figures are read from it; a test
(tests/bench/test_readme_table.py) keeps the README's table equal to this output, so a new
result changes the README by re-running this, never by hand.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"
HEADER = "| figure (machine) | result |\n|---|---|\n"


@cache
def load(name: str) -> Any:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _runs(record: dict[str, Any], **match: str) -> list[dict[str, Any]]:
    return [r for r in record["runs"] if all(r.get(k) == v for k, v in match.items())]


def _tok_s(record: dict[str, Any], **match: str) -> float:
    (run,) = _runs(record, **match)
    return float(run["summary"]["output_throughput"])


def offline_throughput() -> str:
    r = load("offline-h200")["results"]["throughput"]
    ours, hf = r["radixmesh"]["output_tok_per_s"], r["transformers"]["output_tok_per_s"]
    return f"{ours:,.0f} output tok/s; transformers {hf:,.0f} ({ours / hf:.1f}x)"


def offline_shared_prefix() -> str:
    r = load("offline-h200")["results"]["shared_prefix"]
    ours, off = r["radixmesh"]["req_per_s"], r["radixmesh_cache_off"]["req_per_s"]
    hf = r["transformers"]["req_per_s"]
    return f"{ours:.1f} req/s, {ours / off:.1f}x the cache off; transformers {hf:.2f}"


def router_vs_offline() -> str:
    engine = _tok_s(load("serve-offline-defaults-h200"), policy="offline")
    single = load("serve-single-worker-h200")
    http = _tok_s(single, backend="openai-completions", load="inf/s c=256")
    return f"{http:,.0f} vs {engine:,.0f} tok/s ({http / engine:.0%})"


def shared_prefix_goodput() -> str:
    record = load("serve-shared-prefix-h200")
    best = {
        p: max(r["summary"]["goodput"] for r in _runs(record, policy=p))
        for p in ("cache_aware", "round_robin")
    }
    of_ideal = [r["summary"]["cache"]["of_ideal"] for r in _runs(record, policy="cache_aware")]
    ca, rr = best["cache_aware"], best["round_robin"]
    return (
        f"{ca:.2f} vs {rr:.2f} req/s ({ca / rr:.2f}x), "
        f"{min(of_ideal):.0%}-{max(of_ideal):.0%} of the ideal hit rate"
    )


def json_decode() -> str:
    r = load("json_decode-h200")
    on, off = r["jump_forward_on"]["requests_per_s"], r["jump_forward_off"]["requests_per_s"]
    return f"{on:.1f} vs {off:.1f} req/s ({on / off:.2f}x)"


def tensor_parallel() -> str:
    r = load("tp-h200x2")["runs"]
    tput = r["tp2"]["throughput"]["output_tok_per_s"] / r["tp1"]["throughput"]["output_tok_per_s"]
    lat = r["tp2"]["decode_batch1"]["ms_per_token"] / r["tp1"]["decode_batch1"]["ms_per_token"]
    return f"{tput:.2f}x / {lat:.2f}x"


def cpu_offline() -> str:
    r = load("offline-float32-cpu")["results"]["throughput"]
    ours, hf = r["radixmesh"]["output_tok_per_s"], r["transformers"]["output_tok_per_s"]
    return f"{ours:.0f} vs transformers' {hf:.0f} tok/s ({ours / hf:.2f}x)"


def routing_decision() -> str:
    r = load("router_sim-cpu")["decision_latency"]
    return f"p50 {r['p50_us']:.0f} us, p99 {r['p99_us']:.0f} us"


def router_replicas() -> str:
    parts = load("serve-router-tier-h200")["parts"]
    r4 = _tok_s(parts["small-r4"], backend="openai-completions")
    r1 = _tok_s(parts["small"], backend="openai-completions")
    direct = _tok_s(parts["small"], backend="grpc-direct")
    return f"{r4 / 1e3:.1f}k vs {r1 / 1e3:.1f}k vs {direct / 1e3:.1f}k output tok/s"


def replica_hit_rate() -> str:
    parts = load("serve-router-tier-hits-h200")["parts"]

    def hit(part: str) -> float:
        (run,) = _runs(parts[part], workload="shared-prefix")
        return float(run["summary"]["cache"]["hit_rate"])

    r4, r1 = hit("r4"), hit("r1")
    return f"{r4:.1%} vs {r1:.1%} ({r4 / r1:.1%})"


def deterministic_mode() -> str:
    parts = load("offline-deterministic-h200")["parts"]
    on, off = (
        parts[k]["results"]["throughput"]["radixmesh"]["output_tok_per_s"]
        for k in ("deterministic", "default")
    )
    checks = load("deterministic-llama-3-8b-h200")["on"]
    worst = max(checks[m]["exact"] for m in ("single", "mixed", "prefix"))
    cached = checks["cached"]
    return (
        f"{on / off:.2f}x the default's throughput; {worst} unique output per prompt, "
        f"cold = cached {cached['equal_exact']}/{cached['prompts']}"
    )


def fp8_all() -> str:
    ratios = load("tp-fp8-h200")["ratios"]
    tput = ratios["tp1-fp8-all_throughput_vs_bf16"]
    b1 = ratios["tp1-fp8-all_decode_latency_vs_bf16"]
    slots = ratios["tp1-fp8-all_kv_pool_slots_vs_bf16"]
    return f"{tput:.2f}x throughput, {b1:.2f}x batch-1 time per token, {slots:.2f}x KV tokens"


def host_tier_chat() -> str:
    c = load("host_kv-h200")["chat"]
    on, off = (
        c["host_tier"]["later_turns"]["ttft_p50_s"],
        c["device_only"]["later_turns"]["ttft_p50_s"],
    )
    cached_on, cached_off = c["host_tier"]["cached_share"], c["device_only"]["cached_share"]
    return (
        f"TTFT p50 {on * 1e3:.0f} vs {off * 1e3:.0f} ms ({off / on:.1f}x lower), "
        f"{cached_on:.0%} vs {cached_off:.0%} of prompt tokens cached"
    )


def host_tier_routing() -> str:
    record = load("serve-host-tier-routing-h200")

    def hit(workload: str, policy: str) -> float:
        (run,) = _runs(record, workload=workload, policy=policy)
        return float(run["summary"]["cache"]["hit_rate"])

    blind = "cache_aware:host_hit_cost=1.0"
    return (
        f"{hit('shared-prefix', 'cache_aware'):.0%} vs {hit('shared-prefix', blind):.0%} "
        f"(shared prefix), {hit('multi-turn', 'cache_aware'):.0%} vs "
        f"{hit('multi-turn', blind):.0%} (multi-turn)"
    )


def speculative_copy() -> str:
    copy = load("speculative-cpu")["copy"]
    off, ngram = copy["off"], copy["ngram"]
    return (
        f"{ngram['tok_per_s']:.1f} vs {off['tok_per_s']:.1f} output tok/s "
        f"({ngram['speedup']:.2f}x), {ngram['identical_outputs']}/{ngram['tasks']} outputs "
        f"identical, {ngram['mean_accept_length']:.2f} tokens per step"
    )


def speculative_verify() -> str:
    steps = load("speculative-verify-h200")["verify"]
    plain, four = steps["0"], steps["4"]
    return (
        f"{four['ms_per_step']:.2f} vs {plain['ms_per_step']:.2f} ms ({four['ratio']:.2f}x), "
        f"with 8 drafts {steps['8']['ratio']:.2f}x"
    )


def mixture_of_experts() -> str:
    layer = [r for r in load("moe-h100")["rows"] if r["shape"] == "qwen3-30b-a3b"]
    speedups = [r["fused_speedup"] for r in layer]
    tokens = [r["rows"] for r in layer]
    graphs, eager = (
        next(r["ms_per_token"] for r in load("moe-engine-h100")["engine"] if r["graphs"] is on)
        for on in (True, False)
    )
    return (
        f"{min(speedups):.0f}-{max(speedups):.0f}x ({min(tokens)} to {max(tokens):,} tokens); "
        f"{graphs:.2f} vs {eager:.2f} ms a token ({eager / graphs:.1f}x)"
    )


def fp8_experts() -> str:
    mixtral = next(
        r
        for r in load("moe-fp8-h100")["rows"]
        if r["shape"] == "mixtral-8x7b" and r["rows"] == 2048
    )
    w8a8, bf16 = mixtral["fp8_rows"]["w8a8"]["ms"], mixtral["fused_ms"]
    return f"{w8a8:.2f} vs {bf16:.2f} ms ({bf16 / w8a8:.2f}x), half the experts' memory"


ROWS: list[tuple[str, Callable[[], str]]] = [
    ("256 x (512 in, 256 out), `dummy:llama-3-8b` bf16 (one H200)", offline_throughput),
    ("1,024 requests, 16 groups sharing 1,536-token prefixes (one H200)", offline_shared_prefix),
    (
        "one worker through the router over HTTP vs the offline engine (one H200)",
        router_vs_offline,
    ),
    (
        "shared prefixes on two workers: cache_aware vs round_robin goodput at TTFT <= 1 s "
        "(one H200)",
        shared_prefix_goodput,
    ),
    ("JSON decoding, jump-forward on vs off, 64 concurrent (one H200)", json_decode),
    ("tp 2 vs tp 1 throughput / batch-1 latency (two H200s)", tensor_parallel),
    ("32 req x 128 new tokens, float32, smollm2 (2-core CPU)", cpu_offline),
    ("routing decision at 64 workers x 100k cached blocks (2-core CPU)", routing_decision),
    (
        "4 small workers on one H200, streamed HTTP: 4 router replicas vs 1 vs going direct "
        "over gRPC",
        router_replicas,
    ),
    ("shared-prefix hit rate through 4 router replicas vs 1 (one H200)", replica_hit_rate),
    (
        "deterministic mode, 256 x (512, 256) and the batch / mix / prefix / cache checks "
        "(one H200, bf16)",
        deterministic_mode,
    ),
    ("FP8 weights + KV vs bf16, 256 x (512, 256) (one H200)", fp8_all),
    (
        "multi-turn chat at 6x the KV pool: host-memory tier vs none, later turns (one H200)",
        host_tier_chat,
    ),
    (
        "two workers, prefixes beyond their pools: hit rate, tier-aware vs tier-blind router "
        "(one H200)",
        host_tier_routing,
    ),
    (
        "mixture of experts: one Qwen3-30B-A3B sparse layer, grouped GEMMs vs the per-expert "
        "loop; Qwen1.5-MoE-A2.7B batch-1 decoding, CUDA graphs vs eager (one H100)",
        mixture_of_experts,
    ),
    (
        "FP8 experts (FP8 activations on the FP8 MMA) vs bf16 experts: one Mixtral-8x7B "
        "sparse layer, 2,048 tokens (one H100)",
        fp8_experts,
    ),
    (
        "speculative decoding (n-gram) vs off, batch 1, copy-heavy set, smollm2 (2-core CPU)",
        speculative_copy,
    ),
    (
        "speculative decoding: a step verifying 4 drafts vs a plain decode step, batch 1, "
        "`dummy:llama-3-8b` bf16 (one H200)",
        speculative_verify,
    ),
]


def table() -> str:
    return HEADER + "".join(f"| {label} | {figure()} |\n" for label, figure in ROWS)


def readme_table(text: str) -> str:
    """The results table in the README's text (from its header to the first line that is
    not a table row)."""
    rows = []
    for line in text[text.index(HEADER) :].splitlines(keepends=True):
        if not line.startswith("|"):
            break
        rows.append(line)
    return "".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the README's table")
    args = parser.parse_args()
    if not args.write:
        print(table(), end="")
        return
    text = README.read_text()
    README.write_text(text.replace(readme_table(text), table()))


if __name__ == "__main__":
    main()

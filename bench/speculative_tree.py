"""Whether tree-shaped prompt-lookup drafts would pay: the copy-heavy set's greedy outputs,
drafted as a chain (what the n-gram drafter proposes) and as trees of up to B branches,
replayed offline.

Greedy speculative decoding outputs exactly plain greedy decoding's tokens, so with a
request's plain output in hand, what any drafter would have kept at each step follows
without running it: at output position i the drafter sees the prompt and output[:i],
proposes, the step keeps the drafts that equal output[i], output[i + 1], ... and adds
one more token. So a step advances i by accepted + 1 (a step with no draft by 1).

- chain (B = 1): the n-gram drafter's draft (radixmesh/worker/speculative/ngram.py): the
  k tokens after the latest earlier occurrence of the longest suffix of n in [min_n,
  max_n] tokens that occurred before, continued with the occurrence's period past the
  sequence's end.
- tree (B > 1): that chain plus the chains after the next-latest occurrences with a
  different continuation (the same n first, then shorter suffixes), up to B; the tree is
  their trie (shared prefixes once). A step keeps the longest match over its branches;
  its rows are 1 + the trie's nodes (a verify row per node, with a tree mask).

What a row costs comes from one measurement, the verify step against a plain one at
batch 1 on an H100 (`speculative-verify-h100.json`: 1 + k rows cost 1.00x, 1.14x, 1.18x
at k = 0, 4, 8), linear between those and past the last. The projected speed of a tree
is its tokens a step over that cost, against the chain's. The engine's rest rule (a
request whose drafts are kept at under a quarter rests) is not replayed: both sides draft
wherever they find something.

CPU (the bundled model's real weights): `python -m bench.speculative_tree`
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import record
from bench.sets.copy_heavy import TASKS
from radixmesh.worker.engine import Engine
from radixmesh.worker.speculative.ngram import continuation

VERIFY_COST = ((1, 1.00), (5, 1.14), (9, 1.18))  # (rows, step cost vs plain), H100 batch 1


def row_cost(rows: int, points: tuple[tuple[int, float], ...] = VERIFY_COST) -> float:
    """A verify step's cost against a plain one for `rows` rows, piecewise linear through
    `points` and extended past the last two."""
    for (r0, c0), (r1, c1) in itertools.pairwise(points):
        if rows <= r1 or (r1, c1) == points[-1]:
            return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
    raise AssertionError("unreachable")


class Occurrences:
    """Every end position of every n-gram (n in [min_n, max_n]) of a growing sequence,
    latest last."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.ends: dict[tuple[int, ...], list[int]] = defaultdict(list)
        self.indexed = 0

    def grow(self, ids: list[int]) -> None:
        """Index the n-grams ending before len(ids) (a suffix must match an earlier
        occurrence, not itself)."""
        for e in range(max(self.indexed + 1, self.min_n), len(ids)):
            for n in range(self.min_n, min(self.max_n, e) + 1):
                self.ends[tuple(ids[e - n : e])].append(e)
        self.indexed = max(self.indexed, len(ids) - 1)

    def chains(self, ids: list[int], k: int, branches: int) -> list[list[int]]:
        """Up to `branches` distinct k-token continuations, the n-gram drafter's first."""
        self.grow(ids)
        end, found = len(ids), []
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            for at in reversed(self.ends.get(tuple(ids[end - n :]), ())):
                chain = continuation(ids, at, k)
                if chain not in found:
                    found.append(chain)
                    if len(found) == branches:
                        return found
        return found


def trie_nodes(chains: list[list[int]]) -> int:
    return len({tuple(c[: i + 1]) for c in chains for i in range(len(c))})


def replay(
    prompt: list[int], output: list[int], k: int, branches: int, occ: Occurrences
) -> dict[str, Any]:
    """Decode steps after the prefill (which gives output[0]) with `branches`-way drafts."""
    i, steps, drafting, accepted = 1, 0, 0, 0
    rows: list[int] = []
    while i < len(output):
        room = min(k, len(output) - i - 1)  # drafts never run past the output's end
        chains = occ.chains(prompt + output[:i], room, branches) if room > 0 else []
        steps += 1
        if not chains:
            i += 1
            continue
        best = 0
        for c in chains:
            a = 0
            while a < len(c) and c[a] == output[i + a]:
                a += 1
            best = max(best, a)
        drafting += 1
        accepted += best
        rows.append(1 + trie_nodes(chains))
        i += best + 1
    return {"steps": steps, "drafting_steps": drafting, "accepted": accepted, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--ks", default="4,8", help="draft tokens a branch, each in turn")
    ap.add_argument("--branches", default="1,2,3,4")
    ap.add_argument("--ngram-min", type=int, default=2)
    ap.add_argument("--ngram-max", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--outputs", help="a file for the greedy outputs: reused when it exists")
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)

    saved = Path(args.outputs) if args.outputs else None
    if saved is not None and saved.exists():
        pairs = json.loads(saved.read_text())
    else:
        eng = Engine(args.model, device=args.device, dtype=args.dtype)
        pairs = []
        for task in TASKS:  # one at a time, as the copy part of bench.speculative runs
            ids = eng.tokenizer.encode_chat([{"role": "user", "content": task.prompt}])
            params = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens}
            out = eng.generate(input_ids=ids, sampling_params=params)
            assert isinstance(out, dict)
            pairs.append([list(ids), out["output_ids"]])
        eng.shutdown()
        if saved is not None:
            saved.write_text(json.dumps(pairs))

    tokens = sum(len(o) - 1 for _, o in pairs)  # after the prefill's first
    trees: dict[str, Any] = {}
    first_chain = None
    print(
        f"{'k':>3} {'branches':>8} {'steps':>6} {'tok/step':>8} {'accept len':>10} "
        f"{'rows':>6} {'cost':>6} {'vs its chain':>12} {'vs the first chain':>18}"
    )
    for k in (int(x) for x in args.ks.split(",")):
        chain_speed = None
        for b in (int(x) for x in args.branches.split(",")):
            runs = [
                replay(p, o, k, b, Occurrences(args.ngram_min, args.ngram_max)) for p, o in pairs
            ]
            steps = sum(r["steps"] for r in runs)
            drafting = sum(r["drafting_steps"] for r in runs)
            accepted = sum(r["accepted"] for r in runs)
            all_rows = [x for r in runs for x in r["rows"]]
            # Time in plain-step units: plain steps cost 1, drafting steps their rows' cost.
            speed = tokens / ((steps - drafting) + sum(row_cost(x) for x in all_rows))
            chain_speed = chain_speed or speed
            first_chain = first_chain or speed
            f = trees[f"k{k}/b{b}"] = {
                "k": k,
                "branches": b,
                "decode_steps": steps,
                "drafting_steps": drafting,
                "tokens_per_step": tokens / steps,
                "mean_accept_length": (accepted + drafting) / drafting if drafting else None,
                "mean_rows": statistics.fmean(all_rows) if all_rows else None,
                "mean_cost": statistics.fmean(map(row_cost, all_rows)) if all_rows else None,
                "projected_tokens_per_plain_step": speed,
                "vs_chain": speed / chain_speed,
                "vs_first_chain": speed / first_chain,
            }
            print(
                f"{k:>3} {b:>8} {steps:>6} {tokens / steps:>8.2f} "
                f"{f['mean_accept_length'] or 0:>10.2f} {f['mean_rows'] or 0:>6.2f} "
                f"{f['mean_cost'] or 0:>6.3f} {f['vs_chain']:>11.3f}x {f['vs_first_chain']:>17.3f}x"
            )
    record.write(
        "speculative_tree",
        args,
        {"tasks": len(pairs), "output_tokens": tokens, "verify_cost": VERIFY_COST, "trees": trees},
    )


if __name__ == "__main__":
    main()

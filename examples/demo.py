"""The demo `make demo` runs: a local cluster (a router and two workers) on the bundled
SmolLM2-135M-Instruct, on CPU, driven by a program in the frontend language.

1. a multi-turn chat: each turn re-reads the previous ones, which the router finds cached
   on the worker that served them, so the chat stays there;
2. a batch of questions sharing one system prompt: `run_batch` prefills the template once
   and tags the 8 requests as one program, and the router keeps a program's requests on
   the worker holding its prefix while that worker has fewer than `--program-max-queued`
   (32) requests, so the whole batch goes to one worker, which reads the prefix from its
   cache instead of both workers prefilling it (docs/language.md, "Program-aware routing");
3. a fork: one shared text expanded three ways in parallel, on the worker holding it.

Prints the answers, the worker that served each request, how many requests each worker
served in each part and the cache hit ratio (cached / prompt tokens), overall and per
worker, then stops the cluster. The placements printed are the router's own
(`meta_info["worker_id"]`), whatever they turn out to be.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import radixmesh as sgl

SYSTEM = "You are a helpful assistant. Answer briefly, in one sentence."
served: list[dict[str, Any]] = []  # meta_info of every gen, in order
workers: list[str] = []  # the router's worker ids


def record(meta: dict[str, Any]) -> str:
    served.append(meta)
    return (
        f"[{meta['worker_id']}, cached {meta['cached_tokens']}/{meta['prompt_tokens']} "
        "prompt tokens]"
    )


@sgl.function
def chat(s, questions):
    s += sgl.system(SYSTEM)
    for i, question in enumerate(questions):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen(f"answer_{i}", max_tokens=24))


@sgl.function
def capital(s, country):
    s += sgl.system(SYSTEM)
    s += sgl.user(f"What is the capital of {country}?")
    s += sgl.assistant(sgl.gen("answer", max_tokens=16))


@sgl.function
def tips(s, topic):
    s += f"Three short tips about {topic}, one line each.\n"
    forks = s.fork(3)
    for i, f in enumerate(forks):
        f += f"Tip {i + 1}:" + sgl.gen("tip", max_tokens=14, stop="\n")
    forks.join()


def placement(metas: list[dict[str, Any]]) -> str:
    """How many of these requests each worker served, every worker named."""
    counts = Counter(meta["worker_id"] for meta in metas)
    return ", ".join(f"{w} {counts[w]}" for w in workers)


def run_chat() -> None:
    print("== multi-turn chat ==")
    questions = [
        "What is the capital of France? Answer in one word.",
        "What is the capital of Germany?",
        "And the capital of Italy?",
    ]
    s = chat.run(questions=questions, temperature=0)
    metas = [s.get_meta_info(f"answer_{i}") for i in range(len(questions))]
    for i, question in enumerate(questions):
        print(f"user: {question}")
        print(f"assistant: {s[f'answer_{i}'].strip()}  {record(metas[i])}")
    print(f"requests per worker: {placement(metas)}")


def run_batch() -> None:
    print("\n== 8 questions sharing one system prompt (run_batch: one program) ==")
    countries = ["Japan", "Italy", "Canada", "Egypt", "Spain", "Peru", "Kenya", "India"]
    states = capital.run_batch([{"country": c} for c in countries], temperature=0)
    metas = [st.get_meta_info("answer") for st in states]
    for country, st, meta in zip(countries, states, metas, strict=True):
        print(f"{country}: {st['answer'].strip()}  {record(meta)}")
    print(
        f"requests per worker: {placement(metas)} (a program's requests stay on the worker "
        "holding its prefix while it runs or queues fewer than 32)"
    )


def run_fork() -> None:
    print("\n== fork: one prefix, three branches in parallel ==")
    s = tips.run(topic="sleep", temperature=0)
    metas = s.get_meta_info("tip")
    for i, meta in enumerate(metas):
        print(f"Tip {i + 1}:{s['tip'][i]}  {record(meta)}")
    print(f"requests per worker: {placement(metas)}")


def report() -> None:
    print("\n== cache hit ratio (cached / prompt tokens of the requests above) ==")
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for meta in served:
        for key in ("all", meta["worker_id"]):
            totals[key][0] += meta["cached_tokens"]
            totals[key][1] += meta["prompt_tokens"]
            totals[key][2] += 1
    for key in ["all", *workers]:
        cached, prompt, n = totals[key]
        name = "overall" if key == "all" else key
        ratio = f"{cached / prompt:4.0%}" if prompt else "   -"
        print(f"{name:9s} {cached:5d} / {prompt:5d} = {ratio}  ({n} requests)")


def router_workers(http_url: str) -> dict[str, str]:
    """The router's worker ids -> addresses, from its /get_server_info (SGLang's route)."""
    with urllib.request.urlopen(http_url + "/get_server_info", timeout=10) as resp:
        states = json.load(resp)["internal_states"]
    return {w["worker_id"]: w["address"] for w in states}


@contextlib.contextmanager
def output_to(path: str) -> Iterator[None]:
    """Point this process's stdout and stderr at `path` meanwhile: the processes started
    inside inherit them, so the workers' and router's logs go to the file."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def main() -> None:
    start = time.perf_counter()
    log = os.path.join(tempfile.gettempdir(), f"radixmesh-demo-{os.getpid()}.log")
    print(f"starting a router and 2 workers on smollm2 (CPU); their logs: {log}", flush=True)
    with output_to(log):
        runtime = sgl.Runtime(model="smollm2", workers=2)
    with runtime:
        addresses = router_workers(runtime.url)
        workers.extend(addresses)
        named = ", ".join(f"{w} {a}" for w, a in addresses.items())
        print(
            f"cluster ready in {time.perf_counter() - start:.1f}s: router {runtime.address}, "
            f"workers {named}\n",
            flush=True,
        )
        sgl.set_default_backend(runtime)
        run_chat()
        run_batch()
        run_fork()
        report()
        stopping = time.perf_counter()
    print(
        f"\ncluster stopped in {time.perf_counter() - stopping:.1f}s; "
        f"demo took {time.perf_counter() - start:.1f}s"
    )


if __name__ == "__main__":
    main()

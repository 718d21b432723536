"""The demo `make demo` runs: a local cluster (a router and two workers) on the bundled
SmolLM2-135M-Instruct, on CPU, driven by a program in the frontend language.

1. a multi-turn chat: each turn re-reads the previous ones, which the router finds cached
   on the worker that served them, so the chat stays there;
2. a batch of questions sharing one system prompt (`run_batch` prefills the template
   once; the router spreads the batch over both workers);
3. a fork: one shared text expanded three ways in parallel.

Prints the answers, the worker that served each request and the cache hit ratio
(cached / prompt tokens), overall and per worker, then stops the cluster.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import radixmesh as sgl

SYSTEM = "You are a helpful assistant. Answer briefly, in one sentence."
served: list[dict[str, Any]] = []  # meta_info of every gen, in order


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


def run_chat() -> None:
    print("== multi-turn chat ==")
    questions = [
        "What is the capital of France? Answer in one word.",
        "What is the capital of Germany?",
        "And the capital of Italy?",
    ]
    s = chat.run(questions=questions, temperature=0)
    for i, question in enumerate(questions):
        print(f"user: {question}")
        print(f"assistant: {s[f'answer_{i}'].strip()}  {record(s.get_meta_info(f'answer_{i}'))}")


def run_batch() -> None:
    print("\n== 8 questions sharing one system prompt (run_batch) ==")
    countries = ["Japan", "Italy", "Canada", "Egypt", "Spain", "Peru", "Kenya", "India"]
    states = capital.run_batch([{"country": c} for c in countries], temperature=0)
    for country, st in zip(countries, states, strict=True):
        print(f"{country}: {st['answer'].strip()}  {record(st.get_meta_info('answer'))}")


def run_fork() -> None:
    print("\n== fork: one prefix, three branches in parallel ==")
    s = tips.run(topic="sleep", temperature=0)
    for i, meta in enumerate(s.get_meta_info("tip")):
        print(f"Tip {i + 1}:{s['tip'][i]}  {record(meta)}")


def report() -> None:
    print("\n== cache hit ratio (cached / prompt tokens of the requests above) ==")
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for meta in served:
        for key in ("all", meta["worker_id"]):
            totals[key][0] += meta["cached_tokens"]
            totals[key][1] += meta["prompt_tokens"]
            totals[key][2] += 1
    for key in ["all", *sorted(k for k in totals if k != "all")]:
        cached, prompt, n = totals[key]
        name = "overall" if key == "all" else key
        print(f"{name:9s} {cached:5d} / {prompt:5d} = {cached / prompt:4.0%}  ({n} requests)")


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
        print(
            f"cluster ready in {time.perf_counter() - start:.1f}s: router {runtime.address}, "
            f"workers {', '.join(runtime.worker_addresses)}\n",
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

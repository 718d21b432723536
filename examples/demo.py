"""The demo `make demo` runs: the bundled SmolLM2-135M-Instruct on CPU.

A short multi-turn chat (each turn reuses the previous turn's KV from the radix cache)
and a batch of questions that share one long system prompt (prefilled once, then hit by
every request). Prints answers and cached-token counts.
"""

from __future__ import annotations

import time

from radixmesh import Engine

SYSTEM = "You are a helpful assistant. Answer briefly."


def chat(engine: Engine) -> None:
    print("== multi-turn chat ==")
    messages = [{"role": "system", "content": SYSTEM}]
    for question in (
        "What is the capital of France? Answer in one word.",
        "What is the capital of Germany?",
        "And the capital of Italy?",
    ):
        messages.append({"role": "user", "content": question})
        ids = engine.tokenizer.encode_chat(messages)
        out = engine.generate(
            input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 48}
        )
        assert isinstance(out, dict)
        meta = out["meta_info"]
        print(f"user: {question}")
        print(f"assistant: {out['text'].strip()}")
        print(
            f"   prompt {meta['prompt_tokens']} tokens, cached {meta['cached_tokens']}, "
            f"generated {meta['completion_tokens']}"
        )
        messages.append({"role": "assistant", "content": out["text"].strip()})


def shared_prefix_batch(engine: Engine) -> None:
    print("\n== a batch sharing one system prompt ==")
    questions = [
        "What is the capital of Japan?",
        "What is the capital of Italy?",
        "What is the capital of Canada?",
        "What is the capital of Egypt?",
    ]
    prompts = [
        engine.tokenizer.encode_chat(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        )
        for q in questions
    ]
    t0 = time.perf_counter()
    outs = engine.generate(
        input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 24}
    )
    dt = time.perf_counter() - t0
    assert isinstance(outs, list)
    for q, out in zip(questions, outs, strict=True):
        meta = out["meta_info"]
        print(
            f"{q} -> {out['text'].strip()}  "
            f"(cached {meta['cached_tokens']}/{meta['prompt_tokens']} prompt tokens)"
        )
    stats = engine.get_stats()
    print(f"batch took {dt:.2f}s; radix cache hit rate so far: {stats.cache_hit_rate:.0%}")


def main() -> None:
    t0 = time.perf_counter()
    engine = Engine("smollm2")
    print(f"loaded smollm2 in {time.perf_counter() - t0:.1f}s\n")
    try:
        chat(engine)
        shared_prefix_batch(engine)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()

"""A structured LLM program in the frontend language (SGLang's API) on the bundled model.

    .venv/bin/python examples/lang_tips.py

Written for `import sglang as sgl`, it runs with only the import changed: a chat turn, a
fork into parallel branches that share the cached prefix, a select, and a batch.
"""

from __future__ import annotations

import radixmesh as sgl


@sgl.function
def tips(s, topic):
    s += sgl.user(f"Give two short tips about {topic}.")
    s += sgl.assistant(sgl.gen("tips", max_tokens=48))
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += sgl.user(f"Expand tip {i + 1} in one sentence.")
        f += sgl.assistant(sgl.gen("detail", max_tokens=32))
    forks.join()
    s += sgl.user("Is this advice useful? Answer yes or no.")
    s += sgl.assistant(sgl.select("useful", choices=["yes", "no"]))


def main() -> None:
    sgl.set_default_backend(sgl.Engine("smollm2"))
    state = tips.run(topic="sleep", temperature=0)
    for m in state.messages():
        print(f"[{m['role']}] {m['content']}")
    for detail, meta in zip(state["detail"], state.get_meta_info("detail"), strict=True):
        print(f"branch ({meta['cached_tokens']} of {meta['prompt_tokens']} prompt tokens cached):")
        print("   ", detail)
    batch = tips.run_batch([{"topic": t} for t in ("tea", "running", "reading")], temperature=0)
    print("batch verdicts:", [st["useful"] for st in batch])


if __name__ == "__main__":
    main()

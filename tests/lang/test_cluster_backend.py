"""The language on a local cluster: `Runtime` (router + 2 workers) and `RuntimeEndpoint`.

The programs are the in-process tests' own (`test_programs.py`, `test_select.py`), run
here through the gRPC SDK and the router: same structure, cache reuse seen in each gen's
meta_info (with the worker that served it), select decisions equal to the engine's.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

import radixmesh as sgl
from radixmesh.client import Client
from radixmesh.lang.backend.base import Context
from radixmesh.lang.backend.engine import EngineBackend
from radixmesh.lang.backend.runtime import RuntimeEndpoint
from radixmesh.worker.engine import Engine
from tests.lang.test_programs import (
    judge,
    multi_turn,
    phone_extraction,
    qa,
    tip_suggestion,
    tree_of_thought,
    typed,
)
from tests.lang.test_select import CHOICES, PROMPT, few_shot
from tests.lang.test_sglang_programs import check_programs

pytestmark = pytest.mark.slow
WORKERS = {"worker-0", "worker-1"}


@pytest.fixture(scope="module")
def runtime(smollm2_gguf: object) -> Iterator[sgl.Runtime]:
    rt = sgl.Runtime(
        model="smollm2", workers=2, dtype="float32", kv_cache_tokens=8192, max_running_requests=32
    )
    yield rt
    rt.shutdown()


@pytest.fixture
def endpoint(runtime: sgl.Runtime) -> Iterator[RuntimeEndpoint]:
    """The cluster as the default backend for one test, caches empty, idle after."""
    assert runtime.endpoint is not None
    assert runtime.endpoint.flush_cache()
    sgl.set_default_backend(runtime)  # a Runtime stands for its endpoint, as in SGLang
    yield runtime.endpoint
    sgl.global_config.default_backend = None
    assert_idle(runtime)


def assert_idle(runtime: sgl.Runtime) -> None:
    """No request left running or queued on any worker."""
    for address in runtime.worker_addresses:
        with Client(address, service="worker", api_key=runtime.worker_api_key) as client:
            load = client.load()
        assert (load.num_running, load.num_waiting, load.num_in_flight) == (0, 0, 0)


def prefilled_worker_hits(metas: list[dict[str, Any]], prefix_tokens: int) -> int:
    """How many requests the worker holding a prefilled prefix served; each found it cached.

    A fork or a batch prefills its shared prefix once, on one worker, before its requests
    go out together. The router balances them against load (a queued request costs 64
    prompt tokens, more than these tiny prompts share), so some go to the other worker,
    cold; the prefilled one gets the first request and every request it serves hits."""
    by_worker: dict[str, list[bool]] = defaultdict(list)
    for m in metas:
        assert m["worker_id"] in WORKERS
        by_worker[m["worker_id"]].append(m["cached_tokens"] >= prefix_tokens)
    all_hit = [len(hits) for hits in by_worker.values() if all(hits)]
    assert all_hit, dict(by_worker)
    return max(all_hit)


def test_multi_turn_chat_sticks_to_one_worker(endpoint: RuntimeEndpoint) -> None:
    s = multi_turn.run(
        question_1="What is the capital of France? Answer in one word.",
        question_2="And of Germany?",
        temperature=0,
    )
    # float32 on both sides: the same greedy answers as the in-process engine's test
    assert s["answer_1"] == "The capital of France is Paris."
    assert s["answer_2"] == "The capital of Germany is Berlin."
    first, second = s.get_meta_info("answer_1"), s.get_meta_info("answer_2")
    assert first["worker_id"] in WORKERS
    assert second["worker_id"] == first["worker_id"]  # the router follows the cached turn
    assert second["cached_tokens"] >= 49
    assert second["finish_reason"]["type"] == "stop"


def test_sglang_programs_on_the_cluster(endpoint: RuntimeEndpoint) -> None:
    """The engine test's SGLang programs, unchanged, through the router."""
    metas = check_programs(endpoint)
    assert metas[1]["worker_id"] == metas[0]["worker_id"]  # the second turn follows the first
    assert metas[1]["cached_tokens"] >= 49


def test_runtime_speaks_sglangs_http_api(runtime: sgl.Runtime, endpoint: RuntimeEndpoint) -> None:
    """Runtime's SGLang methods go through the router's native HTTP API (`runtime.url`)."""
    import json

    assert runtime.url.startswith("http://") and runtime.generate_url == runtime.url + "/generate"
    out = json.loads(
        runtime.generate("The capital of France is", {"max_new_tokens": 4, "temperature": 0})
    )
    assert out["meta_info"]["completion_tokens"] == 4
    assert (
        out["text"]
        == endpoint.client.generate(
            "The capital of France is", {"max_new_tokens": 4, "temperature": 0}
        ).text
    )

    async def stream() -> list[str]:
        gen = runtime.async_generate("1, 2, 3,", {"max_new_tokens": 5, "temperature": 0})
        return [piece async for piece in gen]

    pieces = asyncio.run(stream())
    assert len(pieces) > 1
    assert (
        "".join(pieces)
        == json.loads(runtime.generate("1, 2, 3,", {"max_new_tokens": 5, "temperature": 0}))["text"]
    )
    assert json.loads(runtime.encode("hi"))["input_ids"] == runtime.get_tokenizer().encode("hi")
    info = asyncio.run(runtime.get_server_info())
    assert info["model_path"] == "smollm2" and info["target"] == runtime.address


def test_fork_join_tip_suggestion(endpoint: RuntimeEndpoint) -> None:
    s = tip_suggestion.run(temperature=0)
    tips = s["detailed_tip"]
    assert isinstance(tips, list) and len(tips) == 5 and all(tips)
    for tip in tips:
        assert f": {tip}\n" in s.text()
    assert s.text().endswith("In summary," + s["summary"])
    prefix = endpoint.tokenizer.encode(
        "Here are five tips for staying healthy: sleep, water, walking, vegetables, friends.\n\n"
    )
    metas = s.get_meta_info("detailed_tip")  # join gathers one meta_info per branch
    # The branches are one program: they stay with the prefix the fork prefilled.
    assert prefilled_worker_hits(metas, len(prefix) - 1) == 5


def test_two_level_tree_of_thought(endpoint: RuntimeEndpoint) -> None:
    before = endpoint.usage.snapshot()["total"]
    s = tree_of_thought.run(question="How many legs do three cats have?", temperature=0)
    text = s.text()
    assert re.findall(r"\[(\d\.\d)\]", text) == ["0.0", "0.1", "1.0", "1.1"]
    assert text.startswith("Question: How many legs do three cats have?\n[0.0]")
    assert text.endswith("Final answer:" + s["answer"])
    after = endpoint.usage.snapshot()["total"]
    # 3 prefills (one per fork), 6 branch gens, the final gen
    assert after.requests - before.requests == 10
    # the second-level forks' prefixes (a block or more) lead the router to the worker
    # that prefilled them; the question alone (11 tokens) is under one 16-token block
    assert after.cached_tokens - before.cached_tokens > 0


def test_llm_judge_three_dimensions(endpoint: RuntimeEndpoint) -> None:
    s = judge.run(essay="The cat sat on the mat. It was happy.")
    verdicts = s["verdict"]
    assert len(verdicts) == 3 and set(verdicts) <= {" good", " bad"}
    assert s.text().endswith("Verdicts:" + ",".join(verdicts))


def test_select_methods_equal_the_engine(endpoint: RuntimeEndpoint, engine: Engine) -> None:
    """The shared scoring code over gRPC gives the in-process engine's logprobs."""
    local = EngineBackend(engine)
    ctx = Context(PROMPT, [], None, "")
    remote_cond, remote_uncond = endpoint.score(ctx, CHOICES, unconditional=True)
    local_cond, local_uncond = local.score(ctx, CHOICES, unconditional=True)
    assert remote_uncond is not None and local_uncond is not None
    for remote, here in ((remote_cond, local_cond), (remote_uncond, local_uncond)):
        assert [[t[1:] for t in c] for c in remote] == [[t[1:] for t in c] for c in here]
        flat_r = [t[0] or 0.0 for c in remote for t in c]
        flat_l = [t[0] or 0.0 for c in here for t in c]
        assert flat_r == pytest.approx(flat_l, abs=1e-4)
    for method in (
        sgl.token_length_normalized,
        sgl.greedy_token_selection,
        sgl.unconditional_likelihood_normalized,
    ):
        on_cluster = few_shot.run(method=method)
        in_process = few_shot.run(method=method, backend=engine)
        assert on_cluster["color"] == in_process["color"]
        assert on_cluster.get_meta_info("color")["normalized_prompt_logprobs"] == pytest.approx(
            in_process.get_meta_info("color")["normalized_prompt_logprobs"], abs=1e-4
        )


def test_regex_constrained_extraction_and_typed_gens(endpoint: RuntimeEndpoint) -> None:
    import json

    s = phone_extraction.run(text="Call Bob at 555-1234 after six.", temperature=0)
    assert s["phone"] == "555-1234"
    t = typed.run(temperature=0)
    assert t.error() is None
    assert re.fullmatch(r"[-+]?[0-9]+", t["legs"])
    assert re.fullmatch(r'"[^"\\\n]*"', t["color"])
    obj = json.loads(t["obj"])
    assert set(obj) == {"name", "age"} and isinstance(obj["age"], int)


def test_logit_bias_and_structural_tags_reach_the_workers(endpoint: RuntimeEndpoint) -> None:
    """Both travel in the gRPC SamplingParams: from the endpoint's backend calls (the
    engine's parameter names) and its SDK client, through the router, to a worker."""
    (banana,) = endpoint.tokenizer.encode(" banana")
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "tag",
            "begin": "<call>",
            "content": {
                "type": "json_schema",
                "json_schema": {"type": "integer", "minimum": 1, "maximum": 9},
            },
            "end": "</call>",
        },
    }
    ctx = Context("The capital of France is", [], None, "")
    params = {"max_new_tokens": 2, "temperature": 0.0, "logit_bias": {banana: 100}}
    text, meta = endpoint.generate(ctx, params)
    assert (text, meta["finish_reason"]["type"]) == (" banana banana", "length")
    text, _ = asyncio.run(
        endpoint.agenerate(
            Context("A number: ", [], None, ""),
            {"max_new_tokens": 12, "temperature": 0.0, "structural_tag": json.dumps(tag)},
        )
    )
    assert isinstance(text, str) and re.fullmatch(r"<call>[1-9]</call>", text)
    out = endpoint.client.generate("Hello", params)
    assert out.text == " banana banana"


def test_run_batch_of_16_shares_the_template(endpoint: RuntimeEndpoint) -> None:
    """Program-aware routing: the batch's requests carry its program id, so the router
    keeps them with the prefix it prefilled; without the ids the policy spreads them
    (a queued request costs more than this small prefix) and the other worker misses."""
    countries = ["France", "Germany", "Italy", "Spain", "Japan", "China", "Egypt", "Peru"] * 2
    batch = [{"question": f"What is the capital of {c}?"} for c in countries]
    states = qa.run_batch(batch, temperature=0)
    prefix = (
        "<|im_start|>system\nYou answer geography questions with one word.<|im_end|>\n"
        "<|im_start|>user\n"
    )
    prefix_tokens = len(endpoint.tokenizer.encode(prefix))
    metas = [st.get_meta_info("answer") for st in states]
    assert [st.error() for st in states] == [None] * 16
    assert [st.messages()[1]["content"] for st in states] == [b["question"] for b in batch]
    assert prefilled_worker_hits(metas, prefix_tokens) == 16  # all together, all cached
    assert states[0]["answer"] == states[8]["answer"]  # same question, greedy
    assert endpoint.flush_cache()
    endpoint.program_hints = False
    try:
        untagged = [st.get_meta_info("answer") for st in qa.run_batch(batch, temperature=0)]
    finally:
        endpoint.program_hints = True
    assert {m["worker_id"] for m in untagged} == WORKERS
    # The worker that did not prefill the prefix misses it at least once (its first request
    # finds its cache flushed). The cached token totals are no measure: how much more than
    # the prefix a request finds (the same question asked twice) depends on timing.
    assert sum(m["cached_tokens"] >= prefix_tokens for m in untagged) < 16


def test_a_failing_program_keeps_its_error_while_the_batch_finishes(
    endpoint: RuntimeEndpoint,
) -> None:
    @sgl.function
    def prog(s, i):
        s += f"Count to {i}:" + sgl.gen("count", max_tokens=3)
        if i == 2:
            raise RuntimeError("program 2 fails")
        s += " done"

    states = prog.run_batch([{"i": i} for i in range(4)], temperature=0)
    errors = [st.error() for st in states]
    assert [e is None for e in errors] == [True, True, False, True]
    assert "program 2 fails" in str(errors[2])
    assert [st.text().endswith(" done") for i, st in enumerate(states) if i != 2] == [True] * 3


def test_streaming_and_async(endpoint: RuntimeEndpoint) -> None:
    s = multi_turn.run(question_1="Hi!", question_2="Name a color.", temperature=0, stream=True)
    pieces = list(s.text_iter())
    assert len(pieces) > 10  # token deltas, not one block
    assert "".join(pieces) == s.text()
    assert s.get_meta_info("answer_2")["worker_id"] in WORKERS

    async def read(st: sgl.ProgramState) -> str:
        return "".join([piece async for piece in st.text_async_iter("answer_1")])

    async def main() -> tuple[list[sgl.ProgramState], list[sgl.ProgramState], list[str]]:
        one = await asyncio.gather(
            *(multi_turn.run_async(question_1=q, question_2="Why?", temperature=0) for q in "AB")
        )
        batch = await qa.run_batch_async(
            [{"question": "What is the capital of Peru?"}] * 2, temperature=0
        )
        # Four streams read at once: no thread waits for their chunks.
        streams = [
            multi_turn.run(question_1=q, question_2="Ok.", temperature=0, stream=True)
            for q in ("Hi!", "Hello!", "Hey!", "Yo!")
        ]
        texts = await asyncio.gather(*(read(st) for st in streams))
        await asyncio.gather(*(asyncio.to_thread(st.sync) for st in streams))  # answer_2 too
        return list(one), batch, [t == st["answer_1"] for t, st in zip(texts, streams, strict=True)]

    single, batch, streamed_equal = asyncio.run(main())
    assert [st.error() for st in single + batch] == [None] * 4
    assert batch[0]["answer"] == batch[1]["answer"]
    assert all(st["answer_2"] for st in single)
    assert streamed_equal == [True] * 4


@sgl.function
def ask(s, i):
    s += f"Question {i}: what comes after {i}? Answer:" + sgl.gen("a", max_tokens=2)
    if s["a"] is not None:  # a read in the body: it waits on the loop, not on a thread
        s += "\nSure?" + sgl.select("sure", choices=[" yes", " no"])


def test_200_concurrent_programs_on_one_thread(endpoint: RuntimeEndpoint) -> None:
    """run_async over the async gRPC client: 200 programs at once on the loop's thread."""

    async def main() -> tuple[int, int, list[sgl.ProgramState], list[str]]:
        before = threading.active_count()
        peak = before
        running = True

        async def watch() -> None:
            nonlocal peak
            while running:
                peak = max(peak, threading.active_count())
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        states = await asyncio.gather(*(ask.run_async(i=i, temperature=0) for i in range(200)))
        streamed = ask.run_async(i=7, temperature=0)
        running = False
        await watcher
        state = await streamed
        pieces = [p async for p in state.text_async_iter()]
        return before, peak, list(states), pieces

    before, peak, states, pieces = asyncio.run(main())
    assert peak <= before + 4, (before, peak)  # no thread per program (grpc's own few)
    assert [st.error() for st in states] == [None] * 200
    assert {st["sure"] for st in states} <= {" yes", " no"}
    assert states[7].text() == "".join(pieces)
    workers = {st.get_meta_info("a")["worker_id"] for st in states}
    assert workers == WORKERS  # the router spread them


def test_n_and_flush_cache(endpoint: RuntimeEndpoint) -> None:
    @sgl.function
    def prog(s):
        s += "Three words about cats:" + sgl.gen("words", max_tokens=4, n=2, temperature=0)

    s = prog.run()
    assert len(s["words"]) == 2 and s["words"][0] == s["words"][1]  # greedy twice
    assert len(s.get_meta_info("words")["choices"]) == 2
    assert sgl.flush_cache() is True


def test_a_runtime_left_running_stops_at_interpreter_exit() -> None:
    import os
    import subprocess
    import sys

    script = (
        "import radixmesh as sgl\n"
        "rt = sgl.Runtime(model='dummy:tiny', workers=1, kv_cache_tokens=2048)\n"
        "print('pids', rt.cluster.router.pid, rt.cluster.workers[0].pid, flush=True)\n"
    )  # no shutdown(): atexit does it
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    )
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("pids "))
    pids = [int(p) for p in line.split()[1:]]
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

"""Programs of the paper's shapes on the in-process engine: structure and cache reuse."""

from __future__ import annotations

import asyncio
import re

import pytest

import radixmesh as sgl
from radixmesh.worker.engine import Engine
from tests.lang.conftest import assert_idle

pytestmark = pytest.mark.slow
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@sgl.function
def multi_turn(s, question_1, question_2):
    s += sgl.user(question_1)
    s += sgl.assistant(sgl.gen("answer_1", max_tokens=12))
    s += sgl.user(question_2)
    s += sgl.assistant(sgl.gen("answer_2", max_tokens=12))


def test_multi_turn_chat(backend: Engine) -> None:
    s = multi_turn.run(
        question_1="What is the capital of France? Answer in one word.",
        question_2="And of Germany?",
        temperature=0,
    )
    assert s["answer_1"] == "The capital of France is Paris."
    assert s["answer_2"] == "The capital of Germany is Berlin."
    assert s.messages() == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is the capital of France? Answer in one word."},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "And of Germany?"},
        {"role": "assistant", "content": "The capital of Germany is Berlin."},
    ]
    assert s.text() == backend.tokenizer.apply_chat_template(
        s.messages(), add_generation_prompt=False
    )
    # The second turn re-reads the first: everything up to the first answer is cached.
    assert s.get_meta_info("answer_2")["cached_tokens"] >= 49
    assert_idle(backend)


@sgl.function
def tip_suggestion(s):
    s += "Here are five tips for staying healthy: sleep, water, walking, vegetables, friends.\n\n"
    forks = s.fork(5)
    for i, f in enumerate(forks):
        f += f"Now, expand tip {i + 1} into one sentence:\n"
        f += sgl.gen("detailed_tip", max_tokens=12, stop="\n\n")
    forks.join()
    for i in range(5):
        s += f"Tip {i + 1}: " + forks[i]["detailed_tip"] + "\n"
    s += "In summary," + sgl.gen("summary", max_tokens=8)


def test_fork_join_tip_suggestion(backend: Engine) -> None:
    s = tip_suggestion.run(temperature=0)
    tips = s["detailed_tip"]  # gathered by join: one value per branch
    assert isinstance(tips, list) and len(tips) == 5
    assert all(isinstance(t, str) and t for t in tips)
    for tip in tips:
        assert f": {tip}\n" in s.text()
    assert s.text().endswith("In summary," + s["summary"])
    assert_idle(backend)


def test_fork_branches_hit_the_prefilled_prefix(backend: Engine) -> None:
    @sgl.function
    def prog(s):
        s += "A list of fruits and one fact about each of them, written by an expert.\n"
        forks = s.fork(3)
        for fruit, f in zip(["Apple", "Banana", "Cherry"], forks, strict=True):
            f += fruit + ":" + sgl.gen("fact", max_tokens=6)
        return forks

    s = prog.run(temperature=0)
    text = "A list of fruits and one fact about each of them, written by an expert.\n"
    prefix = len(backend.tokenizer.encode(text))
    for f in s.ret_value:
        # Every branch, the first included, finds the prefix cached (the prefill ran
        # before any branch); only the fruit's own tokens are new.
        assert f.get_meta_info("fact")["cached_tokens"] >= prefix - 1
    assert_idle(backend)


@sgl.function
def tree_of_thought(s, question):
    s += "Question: " + question + "\n"
    for i, first in enumerate(s.fork(2)):
        first += f"Approach {i + 1}:" + sgl.gen("plan", max_tokens=6, stop="\n") + "\n"
        for j, second in enumerate(first.fork(2)):
            second += f"Step {j + 1}:" + sgl.gen("step", max_tokens=6, stop="\n")
            s += f"[{i}.{j}]" + second["step"] + "\n"
    s += "Final answer:" + sgl.gen("answer", max_tokens=6, stop="\n")


def test_two_level_tree_of_thought(backend: Engine) -> None:
    s = tree_of_thought.run(question="How many legs do three cats have?", temperature=0)
    text = s.text()
    assert re.findall(r"\[(\d\.\d)\]", text) == ["0.0", "0.1", "1.0", "1.1"]
    assert text.startswith("Question: How many legs do three cats have?\n[0.0]")
    assert text.endswith("Final answer:" + s["answer"])
    assert_idle(backend)


@sgl.function
def judge(s, essay):
    s += "Essay: " + essay + "\n"
    forks = s.fork(3)
    for f, dim in zip(forks, ["clarity", "grammar", "relevance"], strict=True):
        f += f"Is the essay's {dim} good or bad? Answer:"
        f += sgl.select("verdict", choices=[" good", " bad"])
    forks.join()
    s += "Verdicts:" + ",".join(forks[i]["verdict"] for i in range(3))


def test_llm_judge_three_dimensions(backend: Engine) -> None:
    s = judge.run(essay="The cat sat on the mat. It was happy.")
    verdicts = s["verdict"]
    assert len(verdicts) == 3 and set(verdicts) <= {" good", " bad"}
    assert s.text().endswith("Verdicts:" + ",".join(verdicts))
    assert_idle(backend)


@sgl.function
def phone_extraction(s, text):
    s += "Text: " + text + "\nThe phone number in the text is "
    s += sgl.gen("phone", regex=r"[0-9]{3}-[0-9]{4}", max_tokens=12)


def test_regex_constrained_extraction(backend: Engine) -> None:
    """Exercises the engine's constrained decoding (a regex)."""
    s = phone_extraction.run(text="Call Bob at 555-1234 after six.", temperature=0)
    err = s.error()
    assert err is None
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", s["phone"])
    assert_idle(backend)


@sgl.function
def qa(s, question):
    s += sgl.system("You answer geography questions with one word.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=6))


def test_run_batch_of_16_shares_the_template(backend: Engine) -> None:
    countries = ["France", "Germany", "Italy", "Spain", "Japan", "China", "Egypt", "Peru"] * 2
    batch = [{"question": f"What is the capital of {c}?"} for c in countries]
    prefix = qa.precache(sgl.lang.backend.registry.resolve_backend(None))
    assert prefix == (
        "<|im_start|>system\nYou answer geography questions with one word.<|im_end|>\n"
        "<|im_start|>user\n"
    )
    states = qa.run_batch(batch, temperature=0, num_threads="auto", progress_bar=True)
    assert len(states) == 16
    prefix_tokens = len(backend.tokenizer.encode(prefix))
    for st, item in zip(states, batch, strict=True):
        assert st.error() is None
        assert st.messages()[1] == {"role": "user", "content": item["question"]}
        assert st["answer"]
        assert st.get_meta_info("answer")["cached_tokens"] >= prefix_tokens
    assert states[0]["answer"] == states[8]["answer"]  # same question, greedy
    assert_idle(backend)


def test_stream_text_iter(backend: Engine) -> None:
    s = multi_turn.run(question_1="Hi!", question_2="Name a color.", temperature=0, stream=True)
    pieces = list(s.text_iter())
    assert len(pieces) > 10  # token deltas, not one block
    assert "".join(pieces) == s.text()
    var_pieces = list(
        multi_turn.run(
            question_1="Hi!", question_2="Name a color.", temperature=0, stream=True
        ).text_iter("answer_2")
    )
    assert len(var_pieces) > 1
    assert "".join(var_pieces) == s["answer_2"]
    assert_idle(backend)


def test_run_async_and_text_async_iter(backend: Engine) -> None:
    async def main() -> tuple[list[str], list[sgl.ProgramState]]:
        states = await asyncio.gather(
            *(
                multi_turn.run_async(question_1=q, question_2="Why?", temperature=0)
                for q in ("Hi!", "Hello!")
            )
        )
        streamed = multi_turn.run(question_1="Hi!", question_2="Why?", temperature=0, stream=True)
        pieces = [p async for p in streamed.text_async_iter("answer_1")]
        await asyncio.to_thread(streamed.sync)
        return pieces, list(states)

    pieces, states = asyncio.run(main())
    assert "".join(pieces) == states[0]["answer_1"]
    assert all(st.error() is None for st in states)
    assert_idle(backend)


def test_n_copy_bind_and_flush(backend: Engine) -> None:
    @sgl.function
    def prog(s, topic):
        s += f"Three words about {topic}:" + sgl.gen("words", max_tokens=4, n=2, temperature=0)

    s = prog.bind(topic="cats").run()
    assert s["words"][0] == s["words"][1] and len(s["words"]) == 2  # greedy twice
    assert s.text() == "Three words about cats:"  # n > 1 appends nothing
    copy = s.copy()
    copy += " dogs"
    assert copy.text() == "Three words about cats: dogs"
    assert s.text() == "Three words about cats:"
    assert sgl.flush_cache() is True
    assert backend.get_stats().cache_size == 0
    assert_idle(backend)


@sgl.function
def typed(s):
    s += "Q: How many legs does a spider have? A: " + sgl.gen_int("legs", max_tokens=4)
    s += "\nQ: Name a color in quotes. A: " + sgl.gen_string("color", max_tokens=8)
    s += "\nJSON: " + sgl.gen(
        "obj",
        max_tokens=40,
        json_schema={
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        },
    )


def test_gen_int_string_and_json_schema(backend: Engine) -> None:
    """Pass-through constraints, decoded by the engine's constrained decoding."""
    import json

    s = typed.run(temperature=0)
    err = s.error()
    assert err is None
    assert re.fullmatch(r"[-+]?[0-9]+", s["legs"])
    assert re.fullmatch(r'"[^"\\\n]*"', s["color"])
    obj = json.loads(s["obj"])
    assert set(obj) == {"name", "age"} and isinstance(obj["age"], int)
    assert_idle(backend)


@sgl.function
def answer_in_words(s, question):
    s.user(question + " Answer in one word.")
    s.assistant(sgl.gen("word", max_tokens=8))


def test_nested_function_and_concatenating_join(backend: Engine) -> None:
    @sgl.function
    def prog(s):
        answer_in_words(s, "What is the capital of France?")  # runs inline on s
        s += "Two more:"
        forks = s.fork(2)
        s += "\n"  # the source moves on; join appends what each branch added after the fork
        for f, city in zip(forks, [" Rome", " Oslo"], strict=True):
            f += city + sgl.gen("fact", max_tokens=3)
        forks.join("concate_and_append")
        return forks

    s = prog.run(temperature=0)
    assert s["word"] == "The capital of France is Paris."
    facts = [f["fact"] for f in s.ret_value]
    assert s.text().endswith(f"Two more:\n Rome{facts[0]} Oslo{facts[1]}")
    assert "fact" not in s  # this mode appends text and gathers no variables
    assert_idle(backend)

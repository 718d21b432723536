"""Ordinary SGLang programs, written against SGLang's API and nothing else.

`programs(sgl)` builds them for a frontend module: `radixmesh` (only the import changed)
or the real `sglang` package. The tests run the same source on the in-process engine, on
a 2-worker cluster through radixmesh's RuntimeEndpoint, and through SGLang's own
RuntimeEndpoint against the router's native HTTP API.
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace
from typing import Any

DOCS = [
    "Paris is the capital of France. It has the Eiffel Tower.",
    "Berlin is the capital of Germany. It has the Brandenburg Gate.",
]


def programs(sgl: ModuleType) -> SimpleNamespace:
    @sgl.function
    def multi_turn(s: Any, question_1: str, question_2: str) -> None:
        with s.user():
            s += question_1
        with s.assistant():
            s += sgl.gen("answer_1", max_tokens=12)
        with s.user():
            s += question_2
        with s.assistant():
            s += sgl.gen("answer_2", max_tokens=12)

    @sgl.function
    def character(s: Any, name: str) -> None:
        s += name + " is a student at a school of magic. Fill in the info in JSON.\n"
        with s.var_scope("json_output"):
            s += "{\n"
            s += '  "name": "' + sgl.gen("name", max_tokens=8, stop='"') + '",\n'
            s += '  "house": "' + sgl.gen("house", choices=["Red", "Green", "Blue"]) + '",\n'
            s += '  "age": ' + sgl.gen("age", max_tokens=4, dtype=int) + "\n"
            s += "}"

    @sgl.function
    def options(s: Any, topic: str) -> None:
        s += f"Three short ideas about {topic}.\n"
        forks = s.fork(3)
        forks += lambda i: f"Idea {i + 1}:" + sgl.gen("idea", max_tokens=8, stop="\n")
        forks[0] += "\nRated:" + sgl.select("rating", choices=[" good", " bad"])
        forks.join("gather_variable")
        s += "Summary:" + sgl.gen("summary", max_tokens=6, stop="\n")

    @sgl.function
    def typed(s: Any) -> None:
        s += "Q: How many hours are in a day?\nA: " + sgl.gen("hours", dtype=int, max_tokens=16)
        s += "\nQ: What is half of 3?\nA: " + sgl.gen("half", dtype=float, max_tokens=16)
        s += "\nQ: Is the sky blue? True or False?\nA: " + sgl.gen("sky", dtype=bool)
        s += "\nQ: Name a fruit, in quotes.\nA: " + sgl.gen("fruit", dtype=str, max_tokens=8)
        s += "\nQ: How many legs has a cat?\nA: " + sgl.gen_int("legs", max_tokens=8)

    @sgl.function
    def react(s: Any, question: str) -> None:
        s += "Answer by searching, then finish.\nQuestion: " + question + "\n"
        for i in range(3):
            s += f"Thought {i + 1}:" + sgl.gen("thought", max_tokens=10, stop="\n") + "\n"
            s += f"Action {i + 1}:" + sgl.select("action", choices=[" Search", " Finish"])
            s += "\n"
            if s["action"] == " Finish":
                break
            s += f"Observation {i + 1}: The answer is 4.\n"
        s += "Final answer:" + sgl.gen("answer", max_tokens=6, stop="\n")

    @sgl.function
    def parallel_encoding(s: Any, question: str) -> None:
        s += "Read the documents, then answer.\n"
        forks = s.fork(len(DOCS))
        forks += [f"Document {i + 1}: {doc}\n" for i, doc in enumerate(DOCS)]
        forks.join("concate_and_append")
        s += "Question: " + question + "\nAnswer:" + sgl.gen("answer", max_tokens=8, stop="\n")

    return SimpleNamespace(
        multi_turn=multi_turn,
        character=character,
        options=options,
        typed=typed,
        react=react,
        parallel_encoding=parallel_encoding,
    )

"""The tracer: graphs and constant prefixes without a model."""

from __future__ import annotations

import radixmesh as sgl
from radixmesh.lang.chat_template import ChatTemplate
from radixmesh.lang.ir import Constant, Gen, RoleBegin, RoleEnd
from radixmesh.lang.tracer import Fork, Placeholder, constant_prefix

CHATML = ChatTemplate(
    {r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ("system", "user", "assistant")},
    "Be nice.",
)


@sgl.function
def qa(s, question, n=2):
    s += sgl.user("Answer briefly. Question: " + question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=8))
    forks = s.fork(n)
    forks += "More:" + sgl.gen("more")
    s += "Done: " + s["answer"]


def test_trace_records_the_graph() -> None:
    graph = qa.trace()
    kinds = [type(n).__name__ for n in graph.nodes]
    assert kinds == [
        "RoleBegin", "Constant", "RoleEnd", "RoleBegin", "Gen", "RoleEnd", "Fork", "Constant",
    ]  # fmt: skip
    fork = graph.nodes[6]
    assert isinstance(fork, Fork) and len(fork.branches) == 2
    assert [type(n) for n in fork.branches[0].nodes] == [Constant, Gen]
    last = graph.nodes[7]
    assert isinstance(last, Constant) and last.value == "Done: " + Placeholder("var:answer")
    const = graph.nodes[1]
    assert isinstance(const, Constant)
    assert const.value == "Answer briefly. Question: " + Placeholder("question")
    gen = graph.nodes[4]
    assert isinstance(gen, Gen) and gen.name == "answer" and gen.params == {"max_new_tokens": 8}
    assert isinstance(graph.nodes[0], RoleBegin) and isinstance(graph.nodes[2], RoleEnd)


def test_constant_prefix_stops_at_the_first_argument() -> None:
    assert constant_prefix(qa.trace(), CHATML) == (
        "<|im_start|>system\nBe nice.<|im_end|>\n"  # the template's default system prompt
        "<|im_start|>user\nAnswer briefly. Question: "
    )


def test_constant_prefix_with_given_arguments_reaches_the_first_gen() -> None:
    assert constant_prefix(qa.trace(question="Why?"), CHATML) == (
        "<|im_start|>system\nBe nice.<|im_end|>\n"
        "<|im_start|>user\nAnswer briefly. Question: Why?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_bound_arguments_are_constants() -> None:
    @sgl.function
    def prog(s, topic, question):
        s += f"Topic: {topic}. Q: {question} A:" + sgl.gen("a")

    assert constant_prefix(prog.bind(topic="math").trace(), CHATML) == "Topic: math. Q: "

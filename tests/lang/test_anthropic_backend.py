"""The Anthropic backend with the real `anthropic` client against a loopback server
that speaks the Messages API (no Anthropic service is reachable from CI)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest

import radixmesh as sgl
from radixmesh.errors import InvalidArgument
from radixmesh.lang.backend.anthropic import Anthropic
from radixmesh.worker.engine import Engine
from tests.lang.conftest import assert_idle
from tests.lang.servers import serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def claude(engine: Engine) -> Iterator[Anthropic]:
    with serve(engine) as url:
        yield sgl.Anthropic("claude-test", base_url=url, api_key="test")


@sgl.function
def chat(s):
    s += sgl.system("You answer in one sentence.")
    s += sgl.user("What is the capital of France?")
    s += sgl.assistant(sgl.gen("answer_1", max_tokens=12))
    s += sgl.user("And of Germany?")
    s += sgl.assistant(sgl.gen("answer_2", max_tokens=12))


def test_messages_api_chat(engine: Engine, claude: Anthropic) -> None:
    via_claude = chat.run(backend=claude)  # the server decodes greedily
    via_engine = chat.run(backend=engine, temperature=0)
    assert via_claude["answer_1"] == via_engine["answer_1"]
    assert via_claude["answer_2"] == via_engine["answer_2"]
    assert via_claude.messages() == via_engine.messages()
    meta = via_claude.get_meta_info("answer_2")
    assert meta["finish_reason"] == "end_turn"
    assert meta["prompt_tokens"] > meta["cached_tokens"] > 0
    assert_idle(engine)


def test_assistant_prefill(engine: Engine, claude: Anthropic) -> None:
    @sgl.function
    def prog(s):
        s += sgl.user("What is the capital of France?")
        s += sgl.assistant("The capital of France is" + sgl.gen("city", max_tokens=3))

    s = prog.run(backend=claude)
    assert s["city"] == " Paris."
    assert s.messages()[-1] == {"role": "assistant", "content": "The capital of France is Paris."}


def test_what_the_api_cannot_do(claude: Anthropic) -> None:
    @sgl.function
    def prog(s, expr):
        s += sgl.user("Pick one.")
        s += sgl.assistant(expr)

    cases = [
        (sgl.select("c", choices=["a", "b"]), "select", "returns no logprobs"),
        (sgl.gen("n", regex="[0-9]+"), "regex", "does not support regex"),
        (sgl.gen("n", n=2), "n", "has no n"),
        (sgl.gen("n", return_logprob=True), "return_logprob", "has no return_logprob"),
    ]
    if "temperature" not in inspect.signature(claude.client.messages.create).parameters:
        cases.append((sgl.gen("n", temperature=0.0), "temperature", "takes no temperature"))
    for expr, field, message in cases:
        err = prog.run(expr=expr, backend=claude).error()
        assert isinstance(err, InvalidArgument), field
        assert err.field == field and message in str(err)

    @sgl.function
    def no_role(s):
        s += "Hi" + sgl.gen("a")

    err = no_role.run(backend=claude).error()
    assert isinstance(err, InvalidArgument) and "inside the assistant role" in str(err)

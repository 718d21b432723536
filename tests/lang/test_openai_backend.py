"""The OpenAI backend with the real `openai` client against a loopback endpoint.

The endpoint (tests/lang/servers.py) is backed by the real engine, so the answers are
the engine's: the same program must give the same text through either backend.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import radixmesh as sgl
from radixmesh.errors import InvalidArgument
from radixmesh.worker.engine import Engine
from tests.lang.conftest import assert_idle
from tests.lang.servers import REQUESTS, serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base_url(engine: Engine) -> Iterator[str]:
    with serve(engine) as url:
        yield url + "/v1"


@sgl.function
def multi_turn(s):
    s += sgl.system("You answer in one sentence.")
    s += sgl.user("What is the capital of France?")
    s += sgl.assistant(sgl.gen("answer_1", max_tokens=12))
    s += sgl.user("And of Germany?")
    s += sgl.assistant(sgl.gen("answer_2", max_tokens=12))


def test_chat_matches_the_engine(engine: Engine, base_url: str) -> None:
    backend = sgl.OpenAI("smollm2", base_url=base_url, api_key="test")
    via_openai = multi_turn.run(backend=backend, temperature=0)
    via_engine = multi_turn.run(backend=engine, temperature=0)
    assert via_openai["answer_1"] == via_engine["answer_1"]
    assert via_openai["answer_2"] == via_engine["answer_2"]
    assert "Berlin" in via_openai["answer_2"]
    assert via_openai.messages() == via_engine.messages()
    assert via_openai.text() == "".join(m["content"] for m in via_openai.messages())
    meta = via_openai.get_meta_info("answer_2")
    assert meta["finish_reason"] == "stop"
    assert meta["cached_tokens"] > 0  # the second turn re-reads the first
    assert_idle(engine)


def test_chat_streaming(engine: Engine, base_url: str) -> None:
    backend = sgl.OpenAI("smollm2", base_url=base_url, api_key="test")
    s = multi_turn.run(backend=backend, temperature=0, stream=True)
    pieces = list(s.text_iter("answer_1"))
    assert len(pieces) > 1
    assert "".join(pieces) == s["answer_1"]
    s.sync()
    assert_idle(engine)


def test_select_with_a_completion_model(engine: Engine, base_url: str) -> None:
    prompt = "Q: What color is the clear daytime sky? A:"
    choices = [" blue", " red", " yellow"]

    @sgl.function
    def prog(s, method):
        s += prompt + sgl.select("c", choices=choices, choices_method=method)

    completion = sgl.OpenAI("smollm2", base_url=base_url, api_key="test", is_chat_model=False)
    for method in (
        sgl.token_length_normalized,
        sgl.greedy_token_selection,
        sgl.unconditional_likelihood_normalized,
    ):
        remote = prog.run(method=method, backend=completion)
        local = prog.run(method=method, backend=engine)
        assert remote["c"] == local["c"], method
        r, loc = remote.get_meta_info("c"), local.get_meta_info("c")
        assert r["normalized_prompt_logprobs"] == pytest.approx(
            loc["normalized_prompt_logprobs"], abs=1e-4
        )
    assert_idle(engine)


def test_completion_model_generates_from_text(engine: Engine, base_url: str) -> None:
    @sgl.function
    def prog(s):
        s += "The capital of France is" + sgl.gen("x", max_tokens=3)

    completion = sgl.OpenAI("smollm2", base_url=base_url, api_key="test", is_chat_model=False)
    assert prog.run(backend=completion, temperature=0)["x"] == " Paris.\n"


def test_what_the_api_cannot_do(base_url: str) -> None:
    chat = sgl.OpenAI("smollm2", base_url=base_url, api_key="test")

    @sgl.function
    def select_prog(s):
        s += sgl.user("Pick one.")
        s += sgl.assistant(sgl.select("c", choices=["a", "b"]))

    err = select_prog.run(backend=chat).error()
    assert isinstance(err, InvalidArgument) and err.field == "select"
    assert "chat completions API does not return" in str(err)

    @sgl.function
    def regex_prog(s):
        s += sgl.user("A number?")
        s += sgl.assistant(sgl.gen("n", regex="[0-9]+"))

    err = regex_prog.run(backend=chat).error()
    assert isinstance(err, InvalidArgument) and err.field == "regex"
    assert "does not support regex" in str(err)

    @sgl.function
    def int_prog(s):
        s += sgl.user("A number?")
        s += sgl.assistant(sgl.gen_int("n"))

    err = int_prog.run(backend=chat).error()
    assert isinstance(err, InvalidArgument) and err.field == "regex"

    @sgl.function
    def top_k_prog(s):
        s += sgl.user("Hi")
        s += sgl.assistant(sgl.gen("a", top_k=5))

    err = top_k_prog.run(backend=chat).error()
    assert isinstance(err, InvalidArgument) and err.field == "top_k"

    @sgl.function
    def no_role(s):
        s += "Hi" + sgl.gen("a")

    err = no_role.run(backend=chat).error()
    assert isinstance(err, InvalidArgument) and "right after the assistant role" in str(err)


def test_api_speculative_execution(engine: Engine, base_url: str) -> None:
    """num_api_spec_tokens: one call serves several gens, with the same text as one call
    per gen (greedy), for completion models and for a chat model's assistant turn."""

    def count(s):
        s += "Count to five: one, two," + sgl.gen("a", max_tokens=4, stop=",")
        s += "," + sgl.gen("b", max_tokens=4, stop=",") + "," + sgl.gen("c", stop=",")

    completion = sgl.OpenAI("smollm2", base_url=base_url, api_key="test", is_chat_model=False)
    before = REQUESTS["/v1/completions"]
    plain = sgl.function(count).run(backend=completion, temperature=0)
    assert REQUESTS["/v1/completions"] - before == 3
    spec = sgl.function(num_api_spec_tokens=16)(count).run(backend=completion, temperature=0)
    assert REQUESTS["/v1/completions"] - before == 4  # the gens share one speculation
    assert [spec[v] for v in "abc"] == [plain[v] for v in "abc"] == [" three", " four", " five"]
    assert spec.text() == plain.text()

    @sgl.function(num_api_spec_tokens=24)
    def turn(s):
        s += sgl.user("What is the capital of France? Answer in one sentence.")
        s += sgl.assistant(sgl.gen("head", stop=" is") + " is" + sgl.gen("tail", stop="."))

    chat = sgl.OpenAI("smollm2", base_url=base_url, api_key="test")
    before = REQUESTS["/v1/chat/completions"]
    s = turn.run(backend=chat, temperature=0)
    assert REQUESTS["/v1/chat/completions"] - before == 1  # one call for the whole turn
    assert s["head"] + " is" + s["tail"] == "The capital of France is Paris"
    assert s.messages()[-1]["content"] == "The capital of France is Paris"
    assert_idle(engine)

"""The LiteLLM backend with the real `litellm` package against a loopback OpenAI endpoint
(tests/lang/servers.py, backed by the real engine): the same answers as the engine's."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import radixmesh as sgl
from radixmesh.errors import InvalidArgument
from radixmesh.worker.engine import Engine
from tests.lang.conftest import assert_idle
from tests.lang.servers import serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base_url(engine: Engine) -> Iterator[str]:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    with serve(engine) as url:
        yield url + "/v1"


@sgl.function
def multi_turn(s):
    s += sgl.system("You answer in one sentence.")
    with s.user():
        s += "What is the capital of France?"
    s += sgl.assistant(sgl.gen("answer", max_tokens=12))


def test_litellm_matches_the_engine(engine: Engine, base_url: str) -> None:
    backend = sgl.LiteLLM("openai/smollm2", base_url=base_url, api_key="test")
    via_litellm = multi_turn.run(backend=backend, temperature=0)
    via_engine = multi_turn.run(backend=engine, temperature=0)
    assert via_litellm["answer"] == via_engine["answer"]
    assert via_litellm.messages() == via_engine.messages()
    streamed = multi_turn.run(backend=backend, temperature=0, stream=True)
    assert "".join(streamed.text_iter("answer")) == via_engine["answer"]

    @sgl.function
    def constrained(s):
        s += sgl.assistant(sgl.gen("n", regex="[0-9]+"))

    with pytest.raises(sgl.ProgramError) as e:
        constrained.run(backend=backend).text()
    assert isinstance(e.value.__cause__, InvalidArgument) and e.value.__cause__.field == "regex"
    assert_idle(engine)

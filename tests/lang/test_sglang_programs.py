"""SGLang programs with only the import changed, on the in-process engine.

The programs are `sglang_programs.py`'s (SGLang's API only); the cluster runs the same
ones in test_cluster_backend.py. Then the rest of SGLang's surface that those programs do
not touch: copies as context managers, item assignment, verbosity, run_batch's options,
min_tokens, separate_reasoning.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import radixmesh as sgl
from radixmesh.worker.engine import Engine
from tests.lang.conftest import assert_idle
from tests.lang.sglang_programs import DOCS, programs

pytestmark = pytest.mark.slow
P = programs(sgl)
NUMBER = re.compile(r"[-+]?[0-9]+")


def check_programs(backend: Any) -> list[dict[str, Any]]:
    """Run every program; assert what holds on any backend; return the gens' meta_info."""
    s = P.multi_turn.run(
        question_1="What is the capital of France? Answer in one word.",
        question_2="And of Germany?",
        temperature=0,
    )
    assert s["answer_1"] == "The capital of France is Paris."
    assert s["answer_2"] == "The capital of Germany is Berlin."
    roles = [m["role"] for m in s.messages()]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    metas = [s.get_meta_info("answer_1"), s.get_meta_info("answer_2")]

    s = P.character.run(name="Ann", temperature=0)
    obj = json.loads(s["json_output"])  # var_scope: the text written inside the block
    assert obj == {"name": s["name"], "house": s["house"], "age": int(s["age"])}
    assert s["house"] in ("Red", "Green", "Blue")

    s = P.options.run(topic="tea", temperature=0)
    assert isinstance(s["idea"], list) and len(s["idea"]) == 3  # one per branch
    assert s["rating"] in ([" good"], [" bad"])  # only branch 0 selected
    assert s.text().startswith("Three short ideas about tea.\nSummary:")

    s = P.typed.run(temperature=0)
    for name in ("hours", "legs"):
        assert NUMBER.fullmatch(s[name]), s[name]  # the stop " " / "\n" cut the end off
        assert s.get_meta_info(name)["finish_reason"]["type"] == "stop"
    assert re.fullmatch(r"[-+]?[0-9]*\.?[0-9]+", s["half"])
    assert s["sky"] in ("True", "False")
    assert re.fullmatch(r'"[\w\s]*"', s["fruit"])

    s = P.react.run(question="What is 2+2?", temperature=0)
    actions = re.findall(r"Action \d: ?(\w+)", s.text())
    assert 1 <= len(actions) <= 3 and set(actions) <= {"Search", "Finish"}
    assert (actions[-1] == "Finish") or len(actions) == 3
    assert s["action"] == " " + actions[-1]
    assert s.text().endswith("Final answer:" + s["answer"])

    s = P.parallel_encoding.run(question="What is the capital of Germany?", temperature=0)
    docs = "".join(f"Document {i + 1}: {d}\n" for i, d in enumerate(DOCS))
    assert s.text().startswith("Read the documents, then answer.\n" + docs + "Question:")
    assert "Berlin" in s["answer"]
    metas.append(s.get_meta_info("answer"))
    return metas


def test_sglang_programs_on_the_engine(backend: Engine) -> None:
    metas = check_programs(backend)
    assert metas[1]["cached_tokens"] >= 49  # the second turn re-reads the first
    assert_idle(backend)


def test_state_and_group_forms(backend: Engine) -> None:
    @sgl.function
    def prog(s):
        s += "Count:"
        with s.copy() as c:  # SGLang's form: the copy's new variables come back
            c += " one" + sgl.gen("next", max_tokens=2, stop="\n")
        s["note"] = "set by hand"
        forks = s.fork(2)
        forks[1] += " two"  # item assignment stores the branch back
        forks += [" A", " B"]
        forks.join()
        return [f.text() for f in forks]

    s = prog.run(temperature=0)
    assert s["next"] == [s["next"][0]] and s["note"] == "set by hand"
    assert s.ret_value == ["Count: A", "Count: two B"]
    with pytest.raises(ValueError, match="cannot append None"):
        s += None
    assert_idle(backend)


def test_run_options(backend: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    @sgl.function
    def prog(s, city, country="France"):
        s += f"{city} is in {country}."

    states = prog.run_batch([["Paris"], ("Lyon", "France"), {"city": "Rome", "country": "Italy"}])
    assert [st.text() for st in states] == [
        "Paris is in France.",
        "Lyon is in France.",
        "Rome is in Italy.",
    ]
    gen = prog.run_batch([{"city": "Nice"}, {"city": "Metz"}], generator_style=True)
    assert not isinstance(gen, list)
    assert [st.text() for st in gen] == ["Nice is in France.", "Metz is in France."]
    assert prog.run_batch([]) == []
    sgl.global_config.verbosity = 2
    try:
        prog.run("Brest")
    finally:
        sgl.global_config.verbosity = 0
    assert capsys.readouterr().out == "Brest is in France.\n"
    assert sgl.get_server_info()["model_path"] == "smollm2"
    assert_idle(backend)


def test_min_tokens_and_separate_reasoning(backend: Engine) -> None:
    @sgl.function
    def prog(s):
        s += sgl.user("What is the capital of France? Answer in one word.")
        s += sgl.assistant(sgl.gen("short", max_tokens=24, min_tokens=16, temperature=0))
        s += "Thinking:" + sgl.separate_reasoning(
            sgl.gen("verdict", regex=r"<think>[a-z ]{2,12}</think> (yes|no)", max_tokens=24),
            model_type="qwen3",
        )

    s = prog.run(temperature=0)
    assert s.get_meta_info("short")["completion_tokens"] >= 16  # EOS banned until then
    assert s["verdict"] in (" yes", " no")
    assert re.fullmatch(r"[a-z ]{2,12}", s["verdict_reasoning_content"])
    assert s.text().endswith("Thinking:" + s["verdict"])  # the state keeps the answer
    with pytest.raises(ValueError, match="model_type: unknown reasoning model type 'x'"):
        sgl.separate_reasoning(sgl.gen("a"), model_type="x")
    assert_idle(backend)

"""Bad input: clear errors on the state or at the call, the batch goes on, nothing leaks."""

from __future__ import annotations

import pytest

import radixmesh as sgl
from radixmesh.errors import InvalidArgument
from radixmesh.worker.engine import Engine
from tests.lang.conftest import assert_idle


@sgl.function
def maybe_fail(s, i):
    s += f"Count to {i}:" + sgl.gen("out", max_tokens=3)
    if i == 2:
        raise RuntimeError("program 2 broke")
    s += "."


@pytest.mark.slow
def test_program_exception_in_a_batch(backend: Engine) -> None:
    states = maybe_fail.run_batch([{"i": i} for i in range(4)], temperature=0, num_threads=2)
    errors = [type(st.error()).__name__ if st.error() else None for st in states]
    assert errors == [None, None, "RuntimeError", None]
    with pytest.raises(sgl.ProgramError, match="program 2 broke"):
        states[2].text()
    with pytest.raises(sgl.ProgramError, match="program 2 broke"):
        states[2]["out"]
    assert states[3].text() == "Count to 3:" + states[3]["out"] + "."
    assert_idle(backend)


@pytest.mark.slow
def test_bad_sampling_parameter_surfaces_on_the_state(backend: Engine) -> None:
    @sgl.function
    def prog(s):
        s += "Hi" + sgl.gen("a", max_tokens=2, top_p=0.0) + sgl.gen("b", max_tokens=2)

    s = prog.run()
    err = s.error()
    assert isinstance(err, InvalidArgument) and err.field == "top_p"
    with pytest.raises(sgl.ProgramError, match=r"failed at test_errors.py:\d+: .*top_p") as info:
        s["b"]  # later expressions are skipped; their reads raise the first error
    # The message names the program line that appended the failing gen.
    line = prog.func.__code__.co_firstlineno + 2
    assert f"test_errors.py:{line}:" in str(info.value)
    assert info.value.__cause__ is err
    assert_idle(backend)


@pytest.mark.slow
def test_failing_fork_branch(backend: Engine) -> None:
    @sgl.function
    def prog(s):
        s += "Colors:"
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += sgl.gen("c", max_tokens=2, temperature=-1.0 if i == 1 else 0.0)
        forks.join()
        s += "never"

    s = prog.run()
    with pytest.raises(sgl.ProgramError, match=r"fork branch 1 failed: .*temperature"):
        s.text()
    assert_idle(backend)


@pytest.mark.slow
def test_image_needs_a_multimodal_model(backend: Engine) -> None:
    @sgl.function
    def prog(s):
        s += sgl.user(sgl.image("cat.png") + "What is this?")

    with pytest.raises(sgl.ProgramError, match="no multimodal model"):
        prog.run().text()

    @sgl.function
    def with_video(s):
        s += sgl.user(sgl.video("cat.mp4", num_frames=4) + "What happens?")

    with pytest.raises(sgl.ProgramError, match="no multimodal model"):
        with_video.run().text()


@pytest.mark.slow
def test_nested_roles(backend: Engine) -> None:
    @sgl.function
    def prog(s):
        s += sgl.user_begin() + sgl.assistant_begin()

    with pytest.raises(sgl.ProgramError, match="role 'assistant' begins inside role 'user'"):
        prog.run().text()


def test_unknown_backend() -> None:
    with pytest.raises(ValueError, match="unknown backend 'nope'; known backends: anthropic"):
        sgl.set_default_backend("nope")
    with pytest.raises(ValueError, match="unknown backend 42"):
        sgl.set_default_backend(42)


def test_no_backend() -> None:
    sgl.global_config.default_backend = None

    @sgl.function
    def prog(s):
        s += "x"

    with pytest.raises(ValueError, match="backend: no backend given and no default set"):
        prog.run()


def test_cluster_backend_bad_input() -> None:
    from radixmesh.cluster.launch import free_port
    from radixmesh.errors import InvalidArgument, Unavailable

    port = free_port()
    with pytest.raises(Unavailable, match=f"no radixmesh router answers at http://.*:{port}"):
        sgl.RuntimeEndpoint(f"http://127.0.0.1:{port}")
    with pytest.raises(InvalidArgument, match="expected 'host:port'") as e:
        sgl.RuntimeEndpoint("localhost")
    assert e.value.field == "base_url"
    with pytest.raises(Unavailable, match=f"no radixmesh router or worker answers at .*:{port}"):
        sgl.RuntimeEndpoint(f"127.0.0.1:{port}")
    with pytest.raises(InvalidArgument, match="not an engine option") as e:
        sgl.Runtime(model="smollm2", workers=2, kv_cache_size=1)  # no such option
    assert e.value.field == "kv_cache_size"
    with pytest.raises(InvalidArgument, match="must be >= 1") as e:
        sgl.Runtime(model="smollm2", workers=0)
    assert e.value.field == "workers"


def test_gen_outside_a_function() -> None:
    with pytest.raises(TypeError, match="Gen is a language expression, not text"):
        f"Answer: {sgl.gen('a')}"
    with pytest.raises(TypeError, match="cannot add int to a program state"):
        "x" + sgl.gen("a") + 3


def test_bad_primitive_arguments() -> None:
    with pytest.raises(ValueError, match="regex: invalid regular expression"):
        sgl.gen("a", regex="[0-9")
    with pytest.raises(ValueError, match="choices: select needs a non-empty list"):
        sgl.select("a", choices=[])
    with pytest.raises(ValueError, match="choices: every choice must be a non-empty string"):
        sgl.select("a", choices=["x", ""])
    with pytest.raises(ValueError, match="choices_method"):
        sgl.select("a", choices=["x"], choices_method="greedy")
    with pytest.raises(ValueError, match="name: a variable name must be a non-empty string"):
        sgl.gen(3)
    with pytest.raises(ValueError, match="dtype: expected int, float, str or bool"):
        sgl.gen("a", dtype=complex)
    with pytest.raises(TypeError, match="unexpected keyword argument 'regex'"):
        sgl.gen_int("a", regex="x")


def test_bad_run_arguments(engine: Engine) -> None:
    @sgl.function
    def prog(s, question):
        s += question

    with pytest.raises(TypeError, match="prog\\(\\): missing a required argument: 'question'"):
        prog.run(backend=engine)
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'answer'"):
        prog.run(question="q", answer="a", backend=engine)
    with pytest.raises(ValueError, match="batch_kwargs: expected a list of dicts"):
        prog.run_batch({"question": "q"}, backend=engine)
    with pytest.raises(ValueError, match="num_threads: expected 'auto' or an integer >= 1"):
        prog.run_batch([{"question": "q"}], num_threads=0, backend=engine)
    with pytest.raises(TypeError, match="has no argument 'answer' to bind"):
        prog.bind(answer="a")
    with pytest.raises(ValueError, match="fork size must be an integer >= 1"):
        prog.run(question="q", backend=engine).fork(0)

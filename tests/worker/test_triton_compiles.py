"""The Triton compile log (worker/triton_compiles.py). Without a GPU nothing compiles (the
kernels run in Triton's interpreter, which calls no hooks), so the compiles here go through
JITFunction's own compile path (`_do_compile`, as `JITFunction.run` calls it at a first
launch) with the compiler itself replaced: Triton's real hook calls, arguments and
specialization, and no code generated."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

from radixmesh.sampling_params import SamplingParams
from radixmesh.worker import triton_compiles
from radixmesh.worker.request import Request
from radixmesh.worker.triton_compiles import CompileLog, compile_phase, describe_rows, tag_steps
from radixmesh.worker.warmup import run_warmup, warmup_plan
from tests.worker.factories import make_worker


def _kernel(x_ptr, n, m, one, BLOCK: tl.constexpr):  # compiled by `_compile` only
    pass


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


def _compile(fn: Any, *args: Any, **kwargs: Any) -> None:
    """What JITFunction.run does at a launch whose specialization is new, up to the
    compile, on a pretend H100 (no driver needed), with a compiler that returns at once."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import JITFunction, compute_cache_key, create_function_from_signature

    jit = fn if isinstance(fn, JITFunction) else JITFunction(fn)
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(jit.signature, jit.params, backend)
    jit.device_caches[0] = ({}, {}, target, backend, binder)
    jit.compile = lambda src, target=None, options=None, **_: "compiled"
    jit.ASTSource = lambda *a: None
    bound, specialization, options = binder(*args, **kwargs)
    key = compute_cache_key({}, specialization, options)
    options, signature, constexprs, attrs = jit._pack_args(
        backend, kwargs, bound, specialization, options
    )
    assert jit._do_compile(key, signature, 0, constexprs, options, attrs, False) == "compiled"


def test_a_compile_is_logged_with_its_specialization_and_phase() -> None:
    x = torch.zeros(64)
    with CompileLog() as log:
        _compile(_kernel, x, 1024, 17, 1, BLOCK=64, num_warps=8)
        with log.in_phase("first"):
            _compile(_kernel, x, 1023, 16, 1, BLOCK=128)
        assert log.phase == "start"
    [a, b] = log.compiles
    assert a.kernel == f"{__name__}._kernel" and a.phase == "start" and a.step is None
    # 1,024 and the tensor: divisible by 16; 17: neither; 1: a constant
    assert a.signature == "x_ptr:*fp32/16, n:i32/16, m:i32, one=1, BLOCK=64, warps=8, stages=3"
    assert b.signature == "x_ptr:*fp32/16, n:i32, m:i32/16, one=1, BLOCK=128, warps=4, stages=3"
    assert b.phase == "first" and 0 <= b.seconds < 1
    assert log.summary() == {
        "start": {"compiles": 1, "seconds": a.seconds},
        "first": {"compiles": 1, "seconds": b.seconds},
    }
    assert [r["phase"] for r in log.records("first")] == ["first"]


def test_hooks_are_put_back_and_earlier_ones_still_called() -> None:
    runtime = triton.knobs.runtime
    seen: list[str] = []

    def before(**kw: Any) -> None:
        seen.append("before")

    def after(**kw: Any) -> None:
        seen.append("after")

    kept = (runtime.jit_cache_hook, runtime.jit_post_compile_hook)
    runtime.jit_cache_hook, runtime.jit_post_compile_hook = before, after
    try:
        with CompileLog() as log:
            assert triton_compiles.active() is log
            with pytest.raises(RuntimeError, match="already open"):
                CompileLog().open()
            _compile(_kernel, torch.zeros(4), 1, 2, 3, BLOCK=16)
        assert seen == ["before", "after"] and len(log.compiles) == 1
        assert (runtime.jit_cache_hook, runtime.jit_post_compile_hook) == (before, after)
        assert triton_compiles.active() is None
    finally:
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = kept


def test_nothing_is_set_or_recorded_without_an_open_log() -> None:
    runtime = triton.knobs.runtime
    hooks = (runtime.jit_cache_hook, runtime.jit_post_compile_hook)
    with CompileLog():
        assert (runtime.jit_cache_hook, runtime.jit_post_compile_hook) != hooks
    assert (runtime.jit_cache_hook, runtime.jit_post_compile_hook) == hooks
    with compile_phase("warmup"):  # no log: nothing to label
        _compile(_kernel, torch.zeros(4), 5, 6, 7, BLOCK=16)
    assert triton_compiles.active() is None


def test_an_interpreted_launch_compiles_nothing() -> None:
    """Under TRITON_INTERPRET (the CPU tests) a launch runs in the interpreter: no compile,
    no record; on a GPU the first launch compiles once and the second does not."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.zeros(100, device=device)
    with CompileLog() as log:
        for _ in range(2):
            _add_one[(4,)](x, 100, BLOCK=32)
    assert torch.equal(x.cpu(), torch.full((100,), 2.0))
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    assert len(log.compiles) == (0 if interpreted else 1)


def test_steps_are_described_by_their_rows() -> None:
    assert describe_rows([1] * 1024) == "1024 decode rows"
    assert describe_rows([1]) == "1 decode row"
    assert describe_rows([128, 512]) == "prefill 2 chunks, 640 tokens"
    assert describe_rows([1] * 600 + [128]) == "mixed: 600 decode rows + 1 chunk, 128 tokens"


class _CompileAtFirstMixedStep:
    """Under the runner: a compile at the first step with a 128-token chunk beside decode
    rows, as a kernel's first launch there would."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.done = False

    def forward(self, batch: Any) -> Any:
        news = [it.num_new_tokens for it in batch.items]
        if not self.done and 128 in news and 1 in news:
            _compile(_kernel, torch.zeros(4), len(news), 3, 1, BLOCK=16)
            self.done = True
        return self.runner.forward(batch)


def test_compiles_name_the_phase_and_step_they_happened_in() -> None:
    """The warm-up labels its compiles "warmup" with their step; the serving scheduler's
    steps are noted once `tag_steps` wraps its runner."""
    w = make_worker(device="cpu")  # the warm-up runs here, under the log
    sc = w.config.scheduler
    plan = warmup_plan(
        sc.token_budget, w.context_len, w.allocator.num_usable_slots, running_cap=sc.running_cap
    )
    w.scheduler.runner = _CompileAtFirstMixedStep(w.scheduler.runner)
    params = SamplingParams(temperature=0.0, max_new_tokens=3, ignore_eos=True)
    with CompileLog() as log:
        report = run_warmup(w.scheduler, plan, w.arch.vocab_size)
        assert log.phase == "start"  # the phase before the warm-up's, again
        w.build_scheduler()
        w.scheduler.runner = _CompileAtFirstMixedStep(w.scheduler.runner)
        tag_steps(w.scheduler)
        tag_steps(w.scheduler)  # once is enough: not wrapped twice
        assert isinstance(w.scheduler.runner, triton_compiles._StepNoting)
        assert not isinstance(w.scheduler.runner.runner, triton_compiles._StepNoting)
        with log.in_phase("first"):
            w.scheduler.add_request(Request(rid="a", prompt_ids=[5] * 7, params=params))
            w.scheduler.step()  # a's prompt
            w.scheduler.add_request(Request(rid="b", prompt_ids=[9] * 128, params=params))
            while w.scheduler.has_work():
                w.scheduler.step()  # a decodes beside b's prompt first
    w.close()
    warmup, first = log.compiles
    mixed = next(i for i, s in enumerate(report.steps) if s.num_tokens == 7 + 128)
    assert (warmup.phase, warmup.step) == ("warmup", mixed + 1)
    assert warmup.batch == "mixed: 7 decode rows + 1 chunk, 128 tokens"
    assert (first.phase, first.step) == ("first", 2)
    assert first.batch == "mixed: 1 decode row + 1 chunk, 128 tokens"

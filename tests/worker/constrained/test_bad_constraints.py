"""Bad constraints: InvalidArgument naming the field and quoting the compiler, before
anything is scheduled; a dead-end grammar finishes the request with a clear reason."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from radixmesh.errors import InvalidArgument
from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.constrained.compile_cache import CompileCache
from radixmesh.worker.constrained.compile_pool import CompilePool
from radixmesh.worker.constrained.grammar import (
    CompilerSpec,
    GrammarBackend,
    GrammarError,
    Matcher,
)
from radixmesh.worker.constrained.manager import GrammarManager
from radixmesh.worker.engine import Engine
from tests.worker.conftest import assert_engine_idle_and_clean
from tests.worker.constrained.compilers import SPEC
from tests.worker.constrained.schemas import integer_ranges

BAD = [
    ({"regex": "[0-9"}, "regex", "invalid regex: Regex parsing error at position 5: Unclosed '['"),
    ({"regex": "(ab"}, "regex", "invalid regex:"),
    ({"json_schema": "{not json"}, "json_schema", "invalid JSON schema: Failed to parse JSON"),
    ({"json_schema": '{"type": "frobnicate"}'}, "json_schema", 'Unsupported type "frobnicate"'),
    (
        {"json_schema": '{"type": "object", "required": "name"}'},
        "json_schema",
        "invalid JSON schema:",
    ),
    ({"ebnf": "root ::= ("}, "ebnf", "invalid EBNF grammar: EBNF parser error at line 1"),
    ({"ebnf": 'start ::= "a"'}, "ebnf", "invalid EBNF grammar:"),  # no root rule
    ({"structural_tag": "{not json"}, "structural_tag", "invalid structural tag: Invalid JSON"),
    ({"choices": []}, "choices", "the choices list is empty"),
    ({"choices": ["yes", ""]}, "choices", "choices must be non-empty strings, got ''"),
    (  # 16 KB: its grammar would serialize to hundreds of MB (refused before compiling)
        {"json_schema": integer_ranges(200)},
        "json_schema",
        "the JSON schema would compile to a grammar of about ",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("params", "field", "quote"), BAD)
def test_bad_constraint_names_field_and_quotes_compiler(
    engine: Engine, params: dict[str, Any], field: str, quote: str
) -> None:
    before = engine.get_stats().num_steps
    with pytest.raises(InvalidArgument) as err:
        engine.generate("Hello", {"max_new_tokens": 4, **params})
    assert err.value.field == field
    assert quote in err.value.message
    assert engine.get_stats().num_steps == before  # nothing was scheduled
    assert_engine_idle_and_clean(engine)


@pytest.mark.slow
def test_dead_end_finishes_with_a_clear_reason(engine: Engine) -> None:
    # After "yes" the grammar allows only EOS, which min_new_tokens bans: no token is left.
    out = engine.generate(
        "Say yes:", {"temperature": 0, "max_new_tokens": 8, "min_new_tokens": 4, "choices": ["yes"]}
    )
    assert isinstance(out, dict)
    assert out["text"] == "yes"
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "abort"
    assert reason["message"] == "the choices allows no next token (grammar dead end)"
    assert_engine_idle_and_clean(engine)


class SlowBackend(GrammarBackend):
    """Compiles only when released: makes the pending path exact."""

    name = "slow"

    def __init__(self) -> None:
        self.release = threading.Event()

    def compile(self, kind: str, text: str) -> Any:
        self.release.wait(10)
        if text == "bad":
            raise GrammarError("no good")
        return text

    def compiler_spec(self) -> CompilerSpec:
        return SPEC

    def load(self, data: str | bytes) -> Any:
        return data

    def matcher(self, compiled: Any) -> Matcher:
        raise NotImplementedError


def slow_manager() -> tuple[GrammarManager, SlowBackend]:
    mgr = GrammarManager(None, 32, [0], compile_processes=0)
    backend = SlowBackend()
    mgr._cache = CompileCache(backend, "test")  # compiles on a thread here
    return mgr, backend


@pytest.fixture(scope="module")
def pooled() -> Iterator[GrammarManager]:
    """A manager compiling in processes, with the test compilers (compilers.py)."""
    mgr = GrammarManager(None, 32, [0], compile_timeout=1.0, compile_memory_bytes=128 << 20)
    pool = CompilePool(SPEC, mgr.compile_limits)
    mgr._pool = pool
    mgr._cache = CompileCache(SlowBackend(), "test", submit=pool.submit)
    yield mgr
    mgr.shutdown()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sleep:60", "the regex did not compile within 1 s (the compile was stopped)"),
        (f"allocate:{1 << 30}", "the regex needed more than 128 MiB to compile"),
        ("fail:" + "x" * 5000, "invalid regex: " + "x" * 1000 + "... (4000 more characters)"),
    ],
    ids=["time", "memory", "long-message"],
)
def test_a_stopped_or_failed_compile_is_invalid_argument(
    pooled: GrammarManager, text: str, message: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        pooled.validate(SamplingParams(regex=text))
    assert (err.value.field, err.value.message) == ("regex", message)
    pooled.validate(SamplingParams(regex="echo:fine"))  # the pool serves on


def test_compile_cache_shares_futures_and_caches_failures() -> None:
    mgr, backend = slow_manager()
    first = mgr.compile("regex", "a+")
    assert mgr.compile("regex", "a+") is first
    assert mgr.compile("json_schema", "a+") is not first
    backend.release.set()
    assert first.result(timeout=5) == "a+"
    with pytest.raises(InvalidArgument, match="invalid regex: no good"):
        mgr.validate(SamplingParams(regex="bad"))
    with pytest.raises(InvalidArgument, match="invalid regex: no good"):
        mgr.validate(SamplingParams(regex="bad"))
    assert (mgr.cache.hits, mgr.cache.misses) == (2, 3)


def test_prepare_waits_on_no_thread() -> None:
    mgr, backend = slow_manager()
    done = mgr.prepare(SamplingParams(regex="a+"))
    assert done is not None and not done.done()  # returned at once, compiling
    backend.release.set()
    assert done.result(timeout=5) is None
    assert mgr.prepare(SamplingParams()) is None  # nothing to compile


def test_unknown_token_bytes_is_invalid_argument() -> None:
    mgr = GrammarManager(object(), 32, [0])
    with pytest.raises(InvalidArgument) as err:
        mgr.validate(SamplingParams(regex="a"))
    assert err.value.field == "regex"
    assert "needs a tokenizer whose token bytes are known" in err.value.message


class NothingAllowed(Matcher):
    def accept_token(self, token: int) -> bool:
        return True

    def rollback(self, num_tokens: int) -> None:
        pass

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].zero_()

    def jump_forward_string(self) -> str:
        return ""

    def is_terminated(self) -> bool:
        return False


def test_empty_mask_marks_a_dead_end_and_allows_everything() -> None:
    from concurrent.futures import Future

    from radixmesh.worker.constrained.request_grammar import RequestGrammar
    from radixmesh.worker.request import FinishReason, Request

    mgr = GrammarManager(None, 40, [0])
    req = Request(rid="d", prompt_ids=[1], params=SamplingParams(regex="a"))
    req.grammar = RequestGrammar("regex", Future(), matcher=NothingAllowed())
    bits = mgr.fill_bitmask([req])
    assert req.grammar.dead_end
    assert bits.tolist() == [[-1, -1]]  # the row's sample is discarded, but must be sane
    mgr.append(req, 5, None, None, output=None)  # type: ignore[arg-type]
    assert req.finish_reason is FinishReason.ABORT
    assert req.error == "the regex allows no next token (grammar dead end)"
    assert req.output_ids == []

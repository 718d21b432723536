"""Compile cost: range-heavy schemas (small texts whose xgrammar grammar serializes to
hundreds of MB) are refused at once with the field named; the estimate follows what
xgrammar builds; the compile process measures the real grammar before serializing it,
and a compile that runs out of memory is a clear error, not a crash."""

from __future__ import annotations

import json
import time

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.tokenizer import Tokenizer
from radixmesh.worker.constrained.compile_pool import CompileLimits, CompilePool
from radixmesh.worker.constrained.cost import COSTLY_WEIGHT, estimate
from radixmesh.worker.constrained.grammar import CompileStopped
from radixmesh.worker.constrained.limits import ConstraintLimits
from radixmesh.worker.constrained.registry import create_grammar_backend
from radixmesh.worker.constrained.vocab import vocab_of
from radixmesh.worker.constrained.xgrammar_backend import XGrammarBackend, XGrammarCompiler
from tests.worker.constrained.conftest import EOS, VOCAB
from tests.worker.constrained.schemas import SCHEMAS, integer_ranges, number_ranges


@pytest.fixture(scope="module")
def xgrammar(tok: Tokenizer) -> XGrammarBackend:
    vocab = vocab_of(tok, VOCAB, [EOS])
    assert vocab is not None
    backend = create_grammar_backend("xgrammar", vocab)
    assert isinstance(backend, XGrammarBackend)
    return backend


@pytest.mark.parametrize(
    ("schema", "ranges", "size"),
    # The hostile probe's shapes: a 16 KB schema of 200 integer ranges (it ran into the
    # 10 s compile kill) and an 8 KB one of 100 number ranges (std::bad_alloc after ~7 s).
    [(integer_ranges(200), 200, 16_000), (number_ranges(100), 100, 8_000)],
)
def test_range_bombs_are_refused_at_once(schema: str, ranges: int, size: int) -> None:
    limits = ConstraintLimits()  # the defaults: the schemas are well inside the other bounds
    assert 0.9 * size <= len(schema) <= 1.2 * size < limits.max_bytes
    t0 = time.perf_counter()
    with pytest.raises(InvalidArgument) as e:
        limits.check("json_schema", schema)
    took = time.perf_counter() - t0
    assert e.value.field == "json_schema"
    assert e.value.message.startswith("the JSON schema would compile to a grammar of about ")
    assert "at most 32 MiB are allowed" in e.value.message
    assert f"its {ranges} numeric ranges (minimum / maximum, " in e.value.message
    assert took < 0.5, took  # one pass over the parsed schema (~10 ms)


def test_everyday_schemas_pass_and_are_small() -> None:
    limits = ConstraintLimits()
    for name, schema in SCHEMAS.items():
        cost = limits.check("json_schema", json.dumps(schema))
        assert not cost.costly, (name, cost)
    assert not limits.check("regex", "[0-9]{3}-[a-z]+").costly
    assert estimate("json_schema", integer_ranges(40)).weight >= COSTLY_WEIGHT


def test_limit_is_a_setting() -> None:
    schema = integer_ranges(40)  # estimated ~15 MiB
    ConstraintLimits().check("json_schema", schema)
    with pytest.raises(InvalidArgument, match=r"at most 4\.0 MiB are allowed"):
        ConstraintLimits(max_compiled_bytes=4 << 20).check("json_schema", schema)
    with pytest.raises(InvalidArgument, match="max_compiled_bytes: must be >= 1"):
        ConstraintLimits(max_compiled_bytes=0)


@pytest.mark.parametrize(
    "schema",
    [
        integer_ranges(30),
        number_ranges(20),
        json.dumps(
            {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(40)}}
        ),
        json.dumps(
            {
                "type": "object",
                "properties": {
                    f"k{i}": {"type": "array", "items": {"type": "integer"}, "maxItems": 5 + i}
                    for i in range(20)
                },
            }
        ),
        json.dumps(
            {
                "type": "object",
                "properties": {f"k{i}": {"type": "string", "maxLength": 20 + i} for i in range(30)},
            }
        ),
    ],
    ids=["integer-ranges", "number-ranges", "strings", "arrays", "bounded-strings"],
)
def test_estimate_follows_xgrammar(xgrammar: XGrammarBackend, schema: str) -> None:
    """Within a factor of 3 of rules x characters of the grammar xgrammar compiles (what
    its serialized size follows): a new xgrammar that expands differently fails here."""
    compiled = xgrammar.compile("json_schema", schema)
    text = str(compiled.grammar)
    measured = text.count("\n") * len(text)
    estimated = estimate("json_schema", schema).serialized_bytes
    assert measured / 3 < estimated < measured * 3, (estimated, measured)


def test_the_compiled_size_is_measured_before_serializing(xgrammar: XGrammarBackend) -> None:
    compiler = XGrammarCompiler(xgrammar._info)
    t0 = time.perf_counter()
    with pytest.raises(CompileStopped) as e:
        compiler.compile_serialized("json_schema", integer_ranges(40), 1 << 20)
    took = time.perf_counter() - t0
    assert str(e.value).startswith("compiled to a grammar of ")
    assert str(e.value).endswith(" MiB; at most 1 MiB are allowed")
    assert took < 5, took  # the compile only (serializing it takes ~2 s here)
    data = compiler.compile_serialized("json_schema", integer_ranges(2), 1 << 20)
    xgrammar.load(data)


def test_out_of_memory_is_a_clear_error_and_the_pool_serves_on(xgrammar: XGrammarBackend) -> None:
    # 96 MiB over the idle process: the schema compiles, and serializing its grammar
    # (10 MB of JSON) fails with std::bad_alloc inside xgrammar.
    limits = CompileLimits(30, 96 << 20, processes=1, max_compiled_bytes=1 << 30)
    pool = CompilePool(xgrammar.compiler_spec(), limits)
    try:
        with pytest.raises(CompileStopped) as e:
            pool.submit("json_schema", integer_ranges(40)).result(timeout=60)
        assert str(e.value) == "needed more than 96 MiB to compile"
        assert pool.stopped == 1
        xgrammar.load(pool.submit("regex", "[0-9]+").result(timeout=60))
    finally:
        pool.shutdown()

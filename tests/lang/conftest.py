from __future__ import annotations

from collections.abc import Iterator

import pytest

import radixmesh as sgl
from radixmesh.worker.engine import Engine


@pytest.fixture(scope="module")
def engine(smollm2_gguf: object) -> Iterator[Engine]:
    """The bundled model, float32 on CPU, one per test module."""
    eng = Engine("smollm2", dtype="float32", kv_cache_tokens=16384, max_running_requests=32)
    yield eng
    eng.shutdown()


@pytest.fixture
def backend(engine: Engine) -> Iterator[Engine]:
    """`engine` as the default backend for one test, with an empty cache."""
    assert engine.flush_cache()
    sgl.set_default_backend(engine)
    yield engine
    sgl.global_config.default_backend = None


def assert_idle(eng: Engine) -> None:
    """No request left running and every KV slot free or cached."""

    def check() -> None:
        w = eng.worker
        assert not w.scheduler.has_work()
        assert w.allocator.num_free_slots + w.cache.total_size() == w.allocator.num_usable_slots

    eng.call(check)

from __future__ import annotations

from collections.abc import Iterator

import pytest

from radixmesh.worker.engine import Engine


@pytest.fixture(scope="session")
def engine(smollm2_gguf: object) -> Iterator[Engine]:
    """The bundled model in one engine for the whole session (float32, CPU)."""
    eng = Engine("smollm2", dtype="float32", kv_cache_tokens=8192, max_running_requests=16)
    yield eng
    eng.shutdown()


def assert_engine_idle_and_clean(eng: Engine) -> None:
    """No request in flight and every slot either free or in the radix tree."""

    def check() -> None:
        w = eng.worker
        assert not w.scheduler.has_work()
        assert w.allocator.num_free_slots + w.cache.total_size() == w.allocator.num_usable_slots
        assert w.cache.protected_size() == 0  # nothing left locked
        assert w.req_table.num_free_rows == w.config.scheduler.max_running_requests

    eng.call(check)

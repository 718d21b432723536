from __future__ import annotations

import gc
import weakref

import radixmesh as sgl
from radixmesh.lang.backend.engine import EngineBackend
from radixmesh.lang.backend.registry import as_backend
from radixmesh.worker.engine import Engine


def test_an_engine_is_wrapped_once_and_collected_after_use(smollm2_gguf: object) -> None:
    eng = Engine("smollm2", dtype="float32", kv_cache_tokens=1024, max_running_requests=4)
    try:
        wrapper = as_backend(eng)
        assert isinstance(wrapper, EngineBackend)
        assert as_backend(eng) is wrapper
        sgl.set_default_backend(eng)
        assert sgl.global_config.default_backend is wrapper
    finally:
        sgl.global_config.default_backend = None
        eng.shutdown()
    engine_ref, worker_ref = weakref.ref(eng), weakref.ref(eng.worker)
    del eng, wrapper
    gc.collect()
    # The wrapper must not keep its engine (weights, KV pool) alive after use.
    assert engine_ref() is None
    assert worker_ref() is None

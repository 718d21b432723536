"""Resumable stream ids: they name their worker by its cache-event epoch, never its id."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.router.dispatch import StreamRef
from radixmesh.router.holders import holders, token_of

RID = "ab" * 16


def _pool(**epochs: int) -> Any:
    """A stand-in for the pool: what holders.py reads of it (workers' summaries' epochs)."""
    workers = {
        w: SimpleNamespace(worker_id=w, summary=SimpleNamespace(epoch=e)) for w, e in epochs.items()
    }
    return SimpleNamespace(workers=workers)


def _ids(handles: list[Any]) -> list[str]:
    return [h.worker_id for h in handles]


def test_a_worker_is_named_by_its_epoch() -> None:
    pool = _pool(**{"worker-0": 0x1F, "worker-1": 0})
    assert token_of(pool, "worker-0") == "000000000000001f"
    assert token_of(pool, "worker-1") == "0000000000000000"  # not synced here yet
    assert token_of(pool, "gone") == "0000000000000000"


def test_every_replica_maps_the_epoch_back_to_its_worker() -> None:
    synced = _pool(**{"worker-0": 0x1F, "worker-1": 0x2A, "worker-2": 0})
    assert _ids(holders(synced, "000000000000002a")) == ["worker-1"]
    # An epoch this replica has not synced: the workers whose epoch it does not know.
    assert _ids(holders(synced, "0000000000000abc")) == ["worker-2"]
    # Named before the naming replica knew the epoch: every worker, unknown ones first.
    assert _ids(holders(synced, "0000000000000000")) == ["worker-2", "worker-0", "worker-1"]
    assert holders(_pool(**{"worker-0": 0x1F}), "0000000000000abc") == []


def test_stream_ids_parse_to_a_token_and_the_workers_request_id() -> None:
    assert StreamRef.parse(f"000000000000001f/{RID}", "stream_id") == ("000000000000001f", RID)
    for bad in (f"worker-0/{RID}", f"1f/{RID}", f"000000000000001F/{RID}", RID, "0" * 16 + "/x"):
        with pytest.raises(InvalidArgument) as e:
            StreamRef.parse(bad, "Last-Event-ID")
        assert e.value.field == "Last-Event-ID"

"""WorkerHandle.re_resolve: a worker that moved (e.g. a restarted Ray actor) is followed to
its new address, with its summary emptied; no process is needed (nothing is called)."""

from __future__ import annotations

import asyncio

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.router.config import RouterConfig
from radixmesh.router.pool import WorkerHandle, WorkerPool
from radixmesh.router.summary import SummaryIndex

CONFIG = RouterConfig(workers=("127.0.0.1:1",))


def test_re_resolve_follows_a_moved_worker_and_forgets_its_blocks() -> None:
    answers: list[str | Exception | None] = [
        "127.0.0.1:1",
        None,
        RuntimeError("actor restarting"),
        "127.0.0.1:2",
        "127.0.0.1:2",
    ]

    async def resolve() -> str | None:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def main() -> list[object]:
        summary = SummaryIndex(1 << 20).add("worker-0")
        summary.reset(7, 3, [11, 12, 13])
        handle = WorkerHandle("worker-0", "127.0.0.1:1", summary, CONFIG, resolve=resolve)
        seen: list[object] = []
        try:
            for _ in range(5):
                seen.append((await handle.re_resolve(), handle.address, len(summary)))
            seen.append((summary.epoch, summary.sequence))
        finally:
            await handle.close()
        return seen

    assert asyncio.run(main()) == [
        (False, "127.0.0.1:1", 3),  # same address
        (False, "127.0.0.1:1", 3),  # not known now
        (False, "127.0.0.1:1", 3),  # the resolver failed
        (True, "127.0.0.1:2", 0),  # moved: reconnect, forget the old process's blocks
        (False, "127.0.0.1:2", 0),
        (0, 0),  # never synced: the event loop pulls a snapshot of the new epoch
    ]


def test_a_handle_without_a_resolver_stays() -> None:
    async def main() -> tuple[bool, str]:
        handle = WorkerHandle("w", "127.0.0.1:1", SummaryIndex(1 << 20).add("w"), CONFIG)
        try:
            return await handle.re_resolve(), handle.address
        finally:
            await handle.close()

    assert asyncio.run(main()) == (False, "127.0.0.1:1")


def test_pool_wants_one_resolver_per_worker() -> None:
    async def resolve() -> str | None:
        return None

    with pytest.raises(InvalidArgument, match="resolvers: give one resolver per worker"):
        WorkerPool(RouterConfig(workers=("a:1", "b:2")), [resolve])

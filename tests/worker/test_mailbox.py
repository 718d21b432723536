"""`next_item`: a stream's wait for its next output."""

from __future__ import annotations

import asyncio

import pytest

from radixmesh.worker.mailbox import next_item


def _never_gone() -> None:
    pass


def test_next_item_returns_what_is_queued() -> None:
    async def main() -> list[int]:
        q: asyncio.Queue[int] = asyncio.Queue()
        q.put_nowait(1)
        first = await next_item(q, 10.0, _never_gone)
        asyncio.get_running_loop().call_later(0.01, q.put_nowait, 2)
        return [first, await next_item(q, 10.0, _never_gone)]

    assert asyncio.run(main()) == [1, 2]


def test_a_cancel_that_meets_a_delivery_still_cancels() -> None:
    """The item and the cancel land in one loop iteration: the waiter must end cancelled
    (Python 3.11's asyncio.wait_for returned the item and dropped the cancel; a stream
    whose client was gone then ran to its last token)."""

    async def main() -> str:
        q: asyncio.Queue[int] = asyncio.Queue()
        waiter = asyncio.ensure_future(next_item(q, 10.0, _never_gone))
        await asyncio.sleep(0)  # the waiter now waits on the queue
        q.put_nowait(7)
        waiter.cancel()
        try:
            await waiter
        except asyncio.CancelledError:
            return "cancelled"
        return "returned"

    assert asyncio.run(main()) == "cancelled"


def test_check_runs_while_waiting_and_its_error_ends_the_wait() -> None:
    calls = []

    def gone() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the producer is gone")

    async def main() -> None:
        await next_item(asyncio.Queue(), 0.01, gone)

    with pytest.raises(RuntimeError, match="producer is gone"):
        asyncio.run(main())
    assert len(calls) == 3

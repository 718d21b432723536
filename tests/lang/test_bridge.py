"""Where a program's blocking reads wait: in a greenlet body on the loop (the loop keeps
running), in a thread (blocks that thread), or in a coroutine (refused)."""

from __future__ import annotations

import asyncio

import pytest

from radixmesh.lang import bridge
from radixmesh.lang.errors import ProgramError


async def seven() -> int:
    await asyncio.sleep(0.05)
    return 7


def test_a_body_on_the_loop_yields_while_it_waits() -> None:
    async def main() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        ticks: list[int] = []

        async def ticker() -> None:
            for i in range(5):
                ticks.append(i)
                await asyncio.sleep(0.005)

        task = asyncio.create_task(ticker())
        out = await bridge.run_body(lambda: bridge.wait(loop, seven()) + bridge.wait(loop, seven()))
        await task
        return ticks, out

    ticks, out = asyncio.run(main())
    assert out == 14
    assert ticks == [0, 1, 2, 3, 4]  # the loop ran the ticker while the body waited


def test_a_body_raises_through_run_body() -> None:
    async def main() -> None:
        await bridge.run_body(lambda: 1 // 0)

    with pytest.raises(ZeroDivisionError):
        asyncio.run(main())


def test_a_thread_blocks_and_a_coroutine_is_refused() -> None:
    assert bridge.wait(bridge.background_loop(), seven()) == 7  # from this thread

    async def main() -> None:
        bridge.wait(asyncio.get_running_loop(), seven())

    with pytest.raises(ProgramError, match="would block its event loop"):
        asyncio.run(main())

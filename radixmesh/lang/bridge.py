"""Synchronous program code over asyncio: where a program's blocking reads wait.

A program's body is plain Python (`s += ...`, `if s["x"] == ...`) whose reads may wait
for the model, while the model calls themselves run as coroutines on an event loop. A
read must wait the right way for where the body runs:

- in a greenlet started by `run_body` (the asyncio API, `run_async`): it switches back
  to the event loop, which awaits, and resumes the body with the result, so thousands of
  bodies share the loop's one thread;
- in an ordinary thread (the synchronous API): it blocks that thread on the loop's work;
- on an event loop's own thread, outside such a greenlet (a coroutine calling a blocking
  read): that would stop the loop, so it fails with an error saying what to do instead.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import greenlet

from radixmesh.lang.errors import ProgramError

T = TypeVar("T")


class _Body(greenlet.greenlet):
    """A program body running on an event loop's thread."""

    def __init__(self, fn: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(fn, greenlet.getcurrent())
        self.loop = loop


async def run_body(fn: Callable[[], T]) -> T:
    """Run `fn` on this loop's thread; its `wait`s suspend it instead of the loop."""
    body = _Body(fn, asyncio.get_running_loop())
    request = body.switch()
    while not body.dead:
        try:
            value = await request
        except BaseException:
            request = body.throw(*sys.exc_info())
        else:
            request = body.switch(value)
    result: T = request
    return result


def wait(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """The result of `coro`, run on `loop`, waited for as the caller can (see above)."""
    current = greenlet.getcurrent()
    if isinstance(current, _Body):
        if current.loop is loop:
            result: T = current.parent.switch(coro)
            return result
        other: T = current.parent.switch(
            asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))
        )
        return other
    if _running_loop() is not None:
        coro.close()
        raise ProgramError(
            "a program state was read from a coroutine, which would block its event loop; "
            "run the program with `await f.run_async(...)`, read states after it returns, "
            "or stream with `async for ... in s.text_async_iter()`"
        )
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


async def await_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Await `coro` from the running loop, running it on `loop` (the same one or not)."""
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


def on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether this thread is running `loop` now (in a coroutine or a body on it)."""
    return _running_loop() is loop


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_background: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def background_loop() -> asyncio.AbstractEventLoop:
    """The process's loop for the synchronous API (one daemon thread, started once)."""
    global _background
    with _lock:
        if _background is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="radixmesh-lang", daemon=True).start()
            _background = loop
        return _background

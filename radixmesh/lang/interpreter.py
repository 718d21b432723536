"""The interpreter: one stream executor per program state.

Each executor owns a thread that runs the state's expressions in order. Appending to a
state only queues an expression, so a program's Python code runs ahead of the model and
independent states (forked branches, programs of a batch) wait on the backend at the
same time, where the engine batches them. Reading a variable waits for the expression
that sets it. The first error stops the executor: later expressions are skipped and
every read raises it.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from radixmesh.lang.backend.base import Backend, Context
from radixmesh.lang.errors import ProgramError
from radixmesh.lang.ir import (
    Constant,
    Expr,
    Gen,
    Image,
    RoleBegin,
    RoleEnd,
    Select,
    flatten,
)

_INT_REGEX = r"[-+]?[0-9]+"
_STR_REGEX = r'"[^"\\\n]*"'
_END = object()


class StreamExecutor:
    def __init__(
        self,
        backend: Backend,
        arguments: dict[str, Any],
        default_params: dict[str, Any],
        stream: bool = False,
    ) -> None:
        self.backend = backend
        self.arguments = arguments
        self.default_params = default_params
        self.stream = stream
        self.text_ = ""
        self.messages_: list[dict[str, str]] = []
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.error_: BaseException | None = None
        self.cur_role: str | None = None
        self.cur_role_begin_pos = 0
        self._var_done: dict[str, threading.Event] = {}
        self._cond = threading.Condition()
        # (variable or None, text delta): what text_iter replays
        self.chunks: list[tuple[str | None, str]] = []
        self.finished = False
        self._on_finish: list[Callable[[], None]] = []
        self._listeners: list[Callable[[], None]] = []
        self._ended = False
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="radixmesh-lang", daemon=True)
        self._thread.start()

    # ---- caller side ----------------------------------------------------------------

    def submit(self, expr: Expr) -> None:
        if self._ended:
            raise ProgramError("this program state has ended; it takes no more expressions")
        for leaf in flatten(expr):
            for name in _names(leaf):
                with self._cond:
                    event = self._var_done.setdefault(name, threading.Event())
                    if self.error_ is None:
                        event.clear()
            self._queue.put(leaf)

    def sync(self) -> None:
        self._queue.join()

    def end(self) -> None:
        """No more expressions: the thread exits once the queued ones ran."""
        if not self._ended:
            self._ended = True
            self._queue.put(_END)

    def _wake_all(self) -> None:
        """Under `_cond`: something changed; wake blocked readers and listeners."""
        self._cond.notify_all()
        for listener in self._listeners:
            listener()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener` (from whichever thread changed the state, so it must be quick
        and thread-safe) on every new chunk, variable, error or end."""
        with self._cond:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        with self._cond:
            self._listeners.remove(listener)

    def poll_chunks(self, start: int, var: str | None) -> tuple[list[tuple[str | None, str]], bool]:
        """`wait_chunks` without waiting."""
        with self._cond:
            return self.chunks[start:], self._over(var)

    def when_finished(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from the executor thread) once the program has ended and every
        queued expression ran; at once if that already happened."""
        with self._cond:
            if not self.finished:
                self._on_finish.append(callback)
                return
        callback()

    async def wait_finished(self) -> None:
        """Await `when_finished` without parking a thread: the executor thread resolves
        a future on the awaiting event loop."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def resolve() -> None:
            if not done.done():
                done.set_result(None)

        def notify() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                loop.call_soon_threadsafe(resolve)

        self.when_finished(notify)
        await done

    def get_var(self, name: str) -> Any:
        with self._cond:
            event = self._var_done.get(name)
        if event is None and name not in self.variables:
            self.sync()
            self.raise_error()
            raise KeyError(f"no variable named {name!r} in this program state")
        if event is not None:
            event.wait()
        self.raise_error()
        return self.variables[name]

    def raise_error(self) -> None:
        if self.error_ is not None:
            raise ProgramError(f"the program failed: {self.error_}") from self.error_

    def fail(self, error: BaseException) -> None:
        """Record `error` (the first one wins) and wake every reader."""
        with self._cond:
            if self.error_ is None:
                self.error_ = error
            for event in self._var_done.values():
                event.set()
            self._wake_all()

    def context(self) -> Context:
        role_text = self.text_[self.cur_role_begin_pos :] if self.cur_role else ""
        return Context(self.text_, list(self.messages_), self.cur_role, role_text)

    def wait_chunks(self, start: int, var: str | None) -> tuple[list[tuple[str | None, str]], bool]:
        """Chunks from index `start` on, waiting for one, and whether no more will come
        (the program ended or failed, or `var` is set)."""
        with self._cond:
            while len(self.chunks) <= start and not self._over(var):
                self._cond.wait()
            return self.chunks[start:], self._over(var)

    def _over(self, var: str | None) -> bool:
        if self.finished or self.error_ is not None:
            return True
        event = self._var_done.get(var) if var is not None else None
        return event is not None and event.is_set()

    def copy_from(self, other: StreamExecutor) -> None:
        self.text_ = other.text_
        self.messages_ = list(other.messages_)
        self.variables = dict(other.variables)
        self.meta_info = dict(other.meta_info)
        self.cur_role = other.cur_role
        self.cur_role_begin_pos = other.cur_role_begin_pos

    # ---- executor thread ------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            expr = self._queue.get()
            if expr is _END:
                with self._cond:
                    self.finished = True
                    callbacks, self._on_finish = self._on_finish, []
                    self._wake_all()
                self._queue.task_done()
                for callback in callbacks:
                    callback()
                return
            try:
                if self.error_ is None:
                    self._execute(expr)
            except BaseException as e:  # recorded; surfaced when the state is read
                self.fail(e)
            finally:
                self._queue.task_done()

    def _execute(self, expr: Expr) -> None:
        if isinstance(expr, Constant):
            self._fill(expr.value)
        elif isinstance(expr, Gen):
            self._gen(expr)
        elif isinstance(expr, Select):
            self._select(expr)
        elif isinstance(expr, RoleBegin):
            self._role_begin(expr.role)
        elif isinstance(expr, RoleEnd):
            self._role_end(expr.role)
        elif isinstance(expr, Image):
            raise ValueError(
                "sgl.image / sgl.video: the backend has no multimodal model (radixmesh "
                "serves text-only Llama-family models)"
            )
        else:
            raise TypeError(f"cannot execute {type(expr).__name__}")

    def _fill(self, text: str, var: str | None = None) -> None:
        with self._cond:
            self.text_ += text
            self.chunks.append((var, text))
            self._wake_all()

    def _set_var(self, name: str | None, value: Any, meta: dict[str, Any] | None) -> None:
        if name is None:
            return
        with self._cond:
            self.variables[name] = value
            if meta is not None:
                self.meta_info[name] = meta
            self._var_done.setdefault(name, threading.Event()).set()
            self._wake_all()

    def _gen(self, expr: Gen) -> None:
        params = {**self.default_params, **expr.params}
        if expr.dtype is int:
            params["regex"] = _INT_REGEX
        elif expr.dtype is str:
            params["regex"] = _STR_REGEX
        params = {k: v for k, v in params.items() if v is not None}
        ctx = self.context()
        if self.stream and params.get("n", 1) == 1:
            pieces: list[str] = []
            meta: dict[str, Any] = {}
            for delta, chunk_meta in self.backend.generate_stream(ctx, params):
                meta = chunk_meta
                pieces.append(delta)
                self._fill(delta, expr.name)
            self._set_var(expr.name, "".join(pieces), meta)
            return
        text, meta = self.backend.generate(ctx, params)
        if isinstance(text, list):  # n > 1: the variable holds every completion
            self._set_var(expr.name, text, meta)
            return
        self._fill(text, expr.name)
        self._set_var(expr.name, text, meta)

    def _select(self, expr: Select) -> None:
        decision = self.backend.select(
            self.context(), expr.choices, expr.temperature, expr.choices_method
        )
        self._fill(decision.decision, expr.name)
        self._set_var(expr.name, decision.decision, decision.meta_info)

    def _role_begin(self, role: str) -> None:
        if self.cur_role is not None:
            raise ValueError(f"role {role!r} begins inside role {self.cur_role!r}: no nesting")
        template = self.backend.chat_template
        if not self.messages_ and role != "system" and template.default_system_prompt:
            self._role_begin("system")
            self._fill(template.default_system_prompt)
            self._role_end("system")
        self.cur_role = role
        self._fill(template.prefix(role))
        self.cur_role_begin_pos = len(self.text_)

    def _role_end(self, role: str) -> None:
        if self.cur_role != role:
            raise ValueError(f"role {role!r} ends but the open role is {self.cur_role!r}")
        content = self.text_[self.cur_role_begin_pos :].lstrip()
        self._fill(self.backend.chat_template.suffix(role))
        self.messages_.append({"role": role, "content": content})
        self.cur_role = None


def _names(expr: Expr) -> list[str]:
    if isinstance(expr, Gen | Select) and expr.name is not None:
        return [expr.name]
    return []


def iter_chunks(executor: StreamExecutor, var: str | None) -> Iterator[str]:
    """The state's text (or one variable's) as it is written, until it is complete."""
    i = 0
    while True:
        chunks, over = executor.wait_chunks(i, var)
        i += len(chunks)
        for name, text in chunks:
            if var is None or name == var:
                yield text
        if over:
            executor.raise_error()
            return

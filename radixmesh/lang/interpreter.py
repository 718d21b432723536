"""The interpreter: one stream executor per program state, all on an event loop.

An executor runs its state's expressions in order, as a task on an event loop (the
running loop for `run_async`, else one shared background loop): no thread per state.
Appending to a state only queues an expression, so a program's Python code runs ahead of
the model and independent states (forked branches, programs of a batch) wait on the
backend at the same time, where the engine batches them. Reading a variable waits for
the expressions that set it (see bridge.py for how a read waits, from a thread or from a
body on the loop). The first error stops the executor: later expressions are skipped
and every read raises it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from radixmesh.client.types import ProgramHint
from radixmesh.lang import bridge
from radixmesh.lang.backend.base import Backend, Context
from radixmesh.lang.errors import ProgramError
from radixmesh.lang.global_config import global_config
from radixmesh.lang.ir import (
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    Constant,
    Expr,
    Gen,
    Image,
    RoleBegin,
    RoleEnd,
    Select,
    SeparateReasoning,
    VarScopeBegin,
    VarScopeEnd,
    Video,
    flatten,
)
from radixmesh.lang.reasoning import split_reasoning
from radixmesh.lang.speculative import ChatSpeculation, CompletionSpeculation

_DTYPE_REGEX = {int: REGEX_INT, float: REGEX_FLOAT, str: REGEX_STR, bool: REGEX_BOOL}
Chunks = list[tuple[str | None, str]]  # (variable or None, text delta): what text_iter replays


class StreamExecutor:
    def __init__(
        self,
        backend: Backend,
        arguments: dict[str, Any],
        default_params: dict[str, Any],
        stream: bool = False,
        num_api_spec_tokens: int | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.backend = backend
        self.arguments = arguments
        self.default_params = default_params
        self.stream = stream
        self.loop = loop if loop is not None else bridge.background_loop()
        self.num_api_spec_tokens = num_api_spec_tokens
        self._completion_spec: CompletionSpeculation | None = None
        self._chat_spec: ChatSpeculation | None = None
        if num_api_spec_tokens is not None:
            if self.stream:
                raise ValueError("stream: speculative execution does not stream")
            if backend.is_chat_model:
                self._chat_spec = ChatSpeculation(num_api_spec_tokens)
            else:
                self._completion_spec = CompletionSpeculation(num_api_spec_tokens)
        self._scopes: dict[str, int] = {}  # var_scope name -> where its text starts
        self._spans: dict[str, tuple[int, int]] = {}  # gen variable -> its text's span
        self.text_ = ""
        self.messages_: list[dict[str, str]] = []
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.error_: BaseException | None = None
        self.cur_role: str | None = None
        self.cur_role_begin_pos = 0
        self.chunks: Chunks = []
        self.finished = False
        # The fork / batch this state belongs to, sent with its requests (programs.py).
        self.program: ProgramHint | None = None
        # Under _lock (callers append from any thread; the loop drains). Reentrant: a
        # state's finalizer ends its executor, and garbage collection may run it on any
        # thread at any allocation, the lock's own holder included.
        self._lock = threading.RLock()
        self._queue: deque[Expr] = deque()
        self._unfinished = 0  # expressions submitted and not yet executed
        self._pending: Counter[str] = Counter()  # variable -> queued expressions setting it
        self._draining = False
        self._ended = False
        self._task: asyncio.Task[None] | None = None
        self._where: dict[int, str] = {}  # queued expression -> the program line it came from
        self.error_where = ""  # the program line whose expression failed
        self._waiters: list[asyncio.Future[None]] = []  # the loop's only

    # ---- caller side (any thread) ---------------------------------------------------

    def submit(self, expr: Expr) -> None:
        if self._ended:
            raise ProgramError("this program state has ended; it takes no more expressions")
        where = program_line()
        with self._lock:
            for leaf in flatten(expr):
                self._pending.update(_names(leaf))
                self._queue.append(leaf)
                self._where[id(leaf)] = where
                self._unfinished += 1
        self._kick()

    def end(self) -> None:
        """No more expressions: the state finishes once the queued ones ran."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._kick()

    def sync(self) -> None:
        self._block(lambda: self._unfinished == 0)

    def get_var(self, name: str) -> Any:
        self._block(lambda: self.error_ is not None or self._pending[name] == 0)
        self.raise_error()
        if name not in self.variables:
            raise KeyError(f"no variable named {name!r} in this program state")
        return self.variables[name]

    def raise_error(self) -> None:
        if self.error_ is not None:
            at = f" at {self.error_where}" if self.error_where else ""
            raise ProgramError(f"the program failed{at}: {self.error_}") from self.error_

    def fail(self, error: BaseException, where: str = "") -> None:
        """Record `error` (the first one wins) and wake every reader."""
        with self._lock:
            if self.error_ is None:
                self.error_ = error
                self.error_where = where
        self._call(self._wake)

    def context(self) -> Context:
        role_text = self.text_[self.cur_role_begin_pos :] if self.cur_role else ""
        return Context(self.text_, list(self.messages_), self.cur_role, role_text, self.program)

    def copy_from(self, other: StreamExecutor) -> None:
        self.text_ = other.text_
        self.messages_ = list(other.messages_)
        self.variables = dict(other.variables)
        self.meta_info = dict(other.meta_info)
        self.cur_role = other.cur_role
        self.cur_role_begin_pos = other.cur_role_begin_pos
        self._spans = dict(other._spans)
        self.program = other.program

    def chunks_after(self, start: int, var: str | None) -> tuple[Chunks, bool]:
        """Chunks from index `start` on, waiting for one, and whether no more will come
        (the program ended or failed, or `var` is set)."""
        self._block(lambda: len(self.chunks) > start or self._over(var))
        return self.chunks[start:], self._over(var)

    async def achunks_after(self, start: int, var: str | None) -> tuple[Chunks, bool]:
        """`chunks_after` for a coroutine (on this executor's loop or another)."""
        await bridge.await_on(
            self.loop, self._until(lambda: len(self.chunks) > start or self._over(var))
        )
        return self.chunks[start:], self._over(var)

    async def wait_finished(self) -> None:
        await bridge.await_on(self.loop, self._until(lambda: self.finished))

    def _over(self, var: str | None) -> bool:
        if self.finished or self.error_ is not None:
            return True
        return var is not None and var in self.variables and self._pending[var] == 0

    # ---- waiting --------------------------------------------------------------------

    def _block(self, ready: Callable[[], bool]) -> None:
        if not ready():
            bridge.wait(self.loop, self._until(ready))

    async def _until(self, ready: Callable[[], bool]) -> None:
        """On the loop: return once `ready()` (checked after every change)."""
        while not ready():
            waiter = self.loop.create_future()
            self._waiters.append(waiter)
            await waiter

    def _wake(self) -> None:
        """On the loop: something changed; let every waiter check again."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _call(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop: now if this is the loop's thread, else soon."""
        if bridge.on_loop(self.loop):
            fn()
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            self.loop.call_soon_threadsafe(fn)

    # ---- the loop's side --------------------------------------------------------------

    def _kick(self) -> None:
        """Make sure a drain task runs while expressions are queued (or to finish)."""
        with self._lock:
            if self._draining or self.finished:
                return
            self._draining = True

        def start() -> None:
            self._task = self.loop.create_task(self._drain())

        self._call(start)

    async def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    finish = self._ended
                    break
                expr = self._queue.popleft()
                where = self._where.pop(id(expr), "")
            try:
                if self.error_ is None:
                    await self._execute(expr)
            except Exception as e:  # recorded; surfaced when the state is read
                self.fail(e, where)
            finally:
                with self._lock:
                    self._unfinished -= 1
                    self._pending.subtract(_names(expr))
                self._wake()
        if finish:
            self.finished = True
            self._wake()

    async def _execute(self, expr: Expr) -> None:
        if isinstance(expr, Constant):
            self._fill(expr.value)
        elif isinstance(expr, Gen):
            await self._gen(expr)
        elif isinstance(expr, Select):
            await self._select(expr)
        elif isinstance(expr, RoleBegin):
            await self._role_begin(expr.role)
        elif isinstance(expr, RoleEnd):
            await self._role_end(expr.role)
        elif isinstance(expr, VarScopeBegin):
            self._scopes[expr.name] = len(self.text_)
        elif isinstance(expr, VarScopeEnd):
            start = self._scopes.pop(expr.name, None)
            if start is None:
                raise ValueError(f"var_scope {expr.name!r} ends but never began")
            self._set_var(expr.name, self.text_[start:], None)
        elif isinstance(expr, SeparateReasoning):
            self._separate_reasoning(expr)
        elif isinstance(expr, Image | Video):
            kind = "image" if isinstance(expr, Image) else "video"
            raise ValueError(
                f"sgl.{kind}: the backend has no multimodal model (radixmesh serves "
                "text-only Llama-family models)"
            )
        else:
            raise TypeError(f"cannot execute {type(expr).__name__}")

    def _fill(self, text: str, var: str | None = None, structural: bool = False) -> None:
        """Append `text` (a variable's, when `var`; a role's marks, when `structural`)."""
        spec = not structural and var is None
        if spec and self._chat_spec is not None and self.cur_role == "assistant":
            self._chat_spec.fill(text)  # written when the turn ends
            return
        if spec and self._completion_spec is not None:
            self._completion_spec.fill(text)
        if var is not None:
            self._spans[var] = (len(self.text_), len(self.text_) + len(text))
        self.text_ += text
        self.chunks.append((var, text))
        self._wake()

    def _set_var(self, name: str | None, value: Any, meta: dict[str, Any] | None) -> None:
        if name is None:
            return
        self.variables[name] = value
        if meta is not None:
            self.meta_info[name] = meta
        self._wake()

    def _params(self, expr: Gen) -> dict[str, Any]:
        """The run's defaults, the gen's own arguments, then what its dtype implies."""
        params = {**self.default_params, **expr.params}
        if expr.dtype is not None:
            params["regex"] = _DTYPE_REGEX[expr.dtype]
            params.pop("json_schema", None)
            if expr.dtype in (int, float):  # where the pattern lets a number end
                params["stop"] = [*_as_list(params.get("stop")), " ", "\n"]
        if not global_config.skip_special_tokens_in_output:
            params["skip_special_tokens"] = False
        if not params.get("stop_regex"):
            params.pop("stop_regex", None)
        return {k: v for k, v in params.items() if v is not None}

    async def _gen(self, expr: Gen) -> None:
        params = self._params(expr)
        ctx = self.context()
        if self._chat_spec is not None and self.cur_role == "assistant":
            self._chat_spec.gen(expr.name, params)  # generated when the turn ends
            return
        if self._completion_spec is not None:
            taken, spec_meta = await self._completion_spec.gen(self.backend, ctx, params)
            self._fill(taken, expr.name)
            self._set_var(expr.name, taken, spec_meta)
            return
        if self.stream and params.get("n", 1) == 1:
            pieces: list[str] = []
            meta: dict[str, Any] = {}
            async for delta, chunk_meta in self.backend.agenerate_stream(ctx, params):
                meta = chunk_meta
                pieces.append(delta)
                self._fill(delta, expr.name)
            self._set_var(expr.name, "".join(pieces), meta)
            return
        result, meta = await self.backend.agenerate(ctx, params)
        if isinstance(result, list):  # n > 1: the variable holds every completion
            self._set_var(expr.name, result, meta)
            return
        self._fill(result, expr.name)
        self._set_var(expr.name, result, meta)

    async def _select(self, expr: Select) -> None:
        decision = await self.backend.aselect(
            self.context(), expr.choices, expr.temperature, expr.choices_method
        )
        self._fill(decision.decision, expr.name)
        self._set_var(expr.name, decision.decision, decision.meta_info)

    async def _role_begin(self, role: str) -> None:
        if self.cur_role is not None:
            raise ValueError(f"role {role!r} begins inside role {self.cur_role!r}: no nesting")
        template = self.backend.chat_template
        if not self.messages_ and role != "system" and template.default_system_prompt:
            await self._role_begin("system")
            self._fill(template.default_system_prompt)
            await self._role_end("system")
        self.cur_role = role
        self._fill(template.prefix(role), structural=True)
        self.cur_role_begin_pos = len(self.text_)

    async def _role_end(self, role: str) -> None:
        if self.cur_role != role:
            raise ValueError(f"role {role!r} ends but the open role is {self.cur_role!r}")
        if self._chat_spec is not None and role == "assistant":
            spec, self._chat_spec = self._chat_spec, None  # the turn's text is written now
            try:
                for term in await spec.finish(self.backend, self.context()):
                    self._fill(term.text, term.name if term.is_gen else None)
                    if term.is_gen:
                        self._set_var(term.name, term.text, {})
            finally:
                self._chat_spec = spec
        content = self.text_[self.cur_role_begin_pos :].lstrip()
        self._fill(self.backend.chat_template.suffix(role), structural=True)
        self.messages_.append({"role": role, "content": content})
        self.cur_role = None

    def _separate_reasoning(self, expr: SeparateReasoning) -> None:
        for name in expr.names:
            text = self.variables.get(name)
            if not isinstance(text, str):
                raise ValueError(f"separate_reasoning: variable {name!r} holds no text")
            reasoning, answer = split_reasoning(text, expr.model_type)
            start, end = self._spans.get(name, (len(self.text_), len(self.text_)))
            if self.text_[start:end] == text:  # the state's text keeps the answer only
                self.text_ = self.text_[:start] + answer + self.text_[end:]
            self._set_var(name, answer, self.meta_info.get(name))
            self._set_var(f"{name}_reasoning_content", reasoning, None)


_LANG_DIR = os.path.dirname(os.path.abspath(__file__))


def program_line() -> str:
    """ "file:line" of the program code that appended (the first caller outside the
    language's own modules), for errors that surface later."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_LANG_DIR):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return ""
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _as_list(stop: Any) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _names(expr: Expr) -> list[str]:
    """The variables an expression sets (a var_scope's when it ends)."""
    if isinstance(expr, Gen | Select) and expr.name is not None:
        return [expr.name]
    if isinstance(expr, VarScopeEnd):
        return [expr.name]
    if isinstance(expr, SeparateReasoning):
        return [*expr.names, *(f"{n}_reasoning_content" for n in expr.names)]
    return []


def iter_chunks(executor: StreamExecutor, var: str | None) -> Iterator[str]:
    """The state's text (or one variable's) as it is written, until it is complete."""
    i = 0
    while True:
        chunks, over = executor.chunks_after(i, var)
        i += len(chunks)
        for name, text in chunks:
            if var is None or name == var:
                yield text
        if over:
            executor.raise_error()
            return


async def aiter_chunks(
    executor: StreamExecutor, var: str | None, with_meta: bool
) -> AsyncIterator[Any]:
    """`iter_chunks` for asyncio; with `with_meta`, (text, the variable's meta_info)."""
    i = 0
    while True:
        chunks, over = await executor.achunks_after(i, var)
        i += len(chunks)
        for name, text in chunks:
            if var is None or name == var:
                yield (text, executor.meta_info.get(name or "", {})) if with_meta else text
        if over:
            executor.raise_error()
            return

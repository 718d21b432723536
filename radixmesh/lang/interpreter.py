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
_END = object()


class StreamExecutor:
    def __init__(
        self,
        backend: Backend,
        arguments: dict[str, Any],
        default_params: dict[str, Any],
        stream: bool = False,
        num_api_spec_tokens: int | None = None,
    ) -> None:
        self.backend = backend
        self.arguments = arguments
        self.default_params = default_params
        self.stream = stream
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
        self._spans = dict(other._spans)

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
        with self._cond:
            if var is not None:
                self._spans[var] = (len(self.text_), len(self.text_) + len(text))
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

    def _gen(self, expr: Gen) -> None:
        params = self._params(expr)
        ctx = self.context()
        if self._chat_spec is not None and self.cur_role == "assistant":
            self._chat_spec.gen(expr.name, params)  # generated when the turn ends
            return
        if self._completion_spec is not None:
            taken, spec_meta = self._completion_spec.gen(self.backend, ctx, params)
            self._fill(taken, expr.name)
            self._set_var(expr.name, taken, spec_meta)
            return
        if self.stream and params.get("n", 1) == 1:
            pieces: list[str] = []
            meta: dict[str, Any] = {}
            for delta, chunk_meta in self.backend.generate_stream(ctx, params):
                meta = chunk_meta
                pieces.append(delta)
                self._fill(delta, expr.name)
            self._set_var(expr.name, "".join(pieces), meta)
            return
        result, meta = self.backend.generate(ctx, params)
        if isinstance(result, list):  # n > 1: the variable holds every completion
            self._set_var(expr.name, result, meta)
            return
        self._fill(result, expr.name)
        self._set_var(expr.name, result, meta)

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
        self._fill(template.prefix(role), structural=True)
        self.cur_role_begin_pos = len(self.text_)

    def _role_end(self, role: str) -> None:
        if self.cur_role != role:
            raise ValueError(f"role {role!r} ends but the open role is {self.cur_role!r}")
        if self._chat_spec is not None and role == "assistant":
            spec, self._chat_spec = self._chat_spec, None  # the turn's text is written now
            try:
                for term in spec.finish(self.backend, self.context()):
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
                with self._cond:
                    self.text_ = self.text_[:start] + answer + self.text_[end:]
            self._set_var(name, answer, self.meta_info.get(name))
            self._set_var(f"{name}_reasoning_content", reasoning, None)


def _as_list(stop: Any) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _names(expr: Expr) -> list[str]:
    if isinstance(expr, Gen | Select) and expr.name is not None:
        return [expr.name]
    if isinstance(expr, VarScopeBegin):
        return [expr.name]
    if isinstance(expr, SeparateReasoning):
        return [*expr.names, *(f"{n}_reasoning_content" for n in expr.names)]
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

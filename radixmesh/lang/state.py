"""Program state: what an `@function` receives as `s` and what `run` returns.

`s += expr` queues expressions on the state's executor and returns at once; reads
(`s["name"]`, `text()`, `messages()`) wait for what they need. A failure inside the
program is kept on the state and raised, as a `ProgramError`, by every read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from radixmesh.lang import bridge
from radixmesh.lang.errors import ProgramError
from radixmesh.lang.interpreter import StreamExecutor, aiter_chunks, iter_chunks
from radixmesh.lang.ir import Expr, RoleWriter, to_expr


class ProgramState(RoleWriter):
    def __init__(self, executor: StreamExecutor) -> None:
        self.stream_executor = executor
        self.ret_value: Any = None  # what the program function returned

    # ---- writing --------------------------------------------------------------------

    def __iadd__(self, other: object) -> ProgramState:
        if other is None:
            raise ValueError("cannot append None to a program state")
        self.stream_executor.submit(to_expr(other))
        return self

    # ---- reading --------------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def get_var(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self.stream_executor.sync()
        self.stream_executor.variables[name] = value

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        self.stream_executor.sync()
        return name in self.stream_executor.variables

    def get_meta_info(self, name: str) -> dict[str, Any]:
        self.get_var(name)
        return self.stream_executor.meta_info.get(name, {})

    def text(self) -> str:
        self.sync()
        self.stream_executor.raise_error()
        return self.stream_executor.text_

    def messages(self) -> list[dict[str, str]]:
        self.sync()
        self.stream_executor.raise_error()
        return list(self.stream_executor.messages_)

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self) -> BaseException | None:
        """The program's error (None if it succeeded so far); waits for queued work."""
        self.sync()
        return self.stream_executor.error_

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text as it is generated: the whole state, or one variable's deltas."""
        return iter_chunks(self.stream_executor, var_name)

    def text_async_iter(
        self, var_name: str | None = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        """`text_iter` for asyncio: awaits the state's executor on its event loop, so many
        streams are read at once on one thread. `return_meta_data`: (text, the
        variable's meta_info so far) pairs."""
        return aiter_chunks(self.stream_executor, var_name, return_meta_data)

    # ---- branching ------------------------------------------------------------------

    def fork(
        self, size: int = 1, position_ids_offset: list[int] | None = None
    ) -> ProgramStateGroup:
        """`size` copies of this state that continue independently (in parallel).

        The shared text is prefilled once first, so every branch hits the cache.
        `position_ids_offset` is accepted and unused, as in SGLang's interpreter: branches
        continue at their text's own positions."""
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"fork size must be an integer >= 1, got {size!r}")
        parent = self.stream_executor
        parent.sync()
        parent.raise_error()
        branches = [self._branch() for _ in range(size)]
        if size > 1:
            # The branches are one program, whose shared prefix is this state's text:
            # the router keeps them with the prefill below (a batch's forks each get
            # their own, so different programs' forks can spread over the workers).
            program = parent.backend.program_hint(parent.text_) or parent.program
            bridge.wait(parent.loop, parent.backend.acache_prefix(parent.text_, program))
            parent.program = program  # the source goes on from the same prefix
            for branch in branches:
                branch.stream_executor.program = program
        return ProgramStateGroup(branches, self, fork_pos=len(parent.text_))

    def copy(self, position_ids_offset: list[int] | None = None) -> ProgramState:
        """One branch of this state. Also SGLang's form, `with s.copy() as c:`, which
        joins the branch's new variables back into this state when the block ends."""
        self.stream_executor.sync()
        self.stream_executor.raise_error()
        return _Copy(self._branch_executor(), self)

    def _branch(self) -> ProgramState:
        return ProgramState(self._branch_executor())

    def _branch_executor(self) -> StreamExecutor:
        parent = self.stream_executor
        child = StreamExecutor(
            parent.backend, parent.arguments, parent.default_params, parent.stream, loop=parent.loop
        )
        child.copy_from(parent)
        return child

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"

    def __del__(self) -> None:
        self.stream_executor.end()


class _Copy(ProgramState):
    def __init__(self, executor: StreamExecutor, src: ProgramState) -> None:
        super().__init__(executor)
        self._src = src
        self._fork_pos = len(src.stream_executor.text_)

    def __enter__(self) -> ProgramState:
        return self

    def __exit__(self, *exc: object) -> None:
        ProgramStateGroup([self], self._src, self._fork_pos).join()


class ProgramStateGroup:
    """The branches of a fork: index them, append to all, `join` back."""

    def __init__(
        self, states: list[ProgramState], src_state: ProgramState, fork_pos: int = 0
    ) -> None:
        self.states = states
        self.src_state = src_state
        self.fork_pos = fork_pos  # length of the text the branches started from

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        """What `forks[i] += x` stores back: the same branch (`+=` appends in place)."""
        if value is not self.states[i]:
            raise ValueError("a fork's branches cannot be replaced; append to them with +=")

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: object) -> ProgramStateGroup:
        """One expression for every branch, a list / tuple of one per branch, or a
        function of the branch's index (`forks += lambda i: ...`)."""
        if callable(other) and not isinstance(other, Expr):
            for i, state in enumerate(self.states):
                state += other(i)
        elif isinstance(other, list | tuple):
            if len(other) != len(self.states):
                raise ValueError(f"got {len(other)} items for {len(self.states)} branches")
            for state, item in zip(self.states, other, strict=True):
                state += item
        else:
            expr = to_expr(other)
            for state in self.states:
                state += expr
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every branch and bring its results to the source state.

        gather_variable: each variable the source state did not have and a branch
        created becomes a list on the source state (one value per branch that set it, in
        branch order), and so does its meta_info. concate_and_append: the text every
        branch added is appended to the source state, in branch order."""
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError(
                f"join mode must be 'gather_variable' or 'concate_and_append', got {mode!r}"
            )
        for state in self.states:
            state.sync()
        for i, state in enumerate(self.states):
            err = state.stream_executor.error_
            if err is not None:
                raise ProgramError(f"fork branch {i} failed: {err}") from err
        src = self.src_state.stream_executor
        src.sync()
        if mode == "concate_and_append":
            self.src_state += "".join(s.stream_executor.text_[self.fork_pos :] for s in self)
            src.sync()
        else:
            self._gather(src)
        for state in self.states:
            state.stream_executor.end()

    def _gather(self, src: StreamExecutor) -> None:
        known = set(src.variables)
        for state in self.states:
            branch = state.stream_executor
            for name in branch.variables.keys() - known:
                src.variables.setdefault(name, []).append(branch.variables[name])
                src.meta_info.setdefault(name, []).append(branch.meta_info.get(name, {}))

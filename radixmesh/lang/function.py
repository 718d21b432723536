"""`@function`: a program, and how it runs (`run`, `run_async`, `run_batch`, `trace`)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixmesh.client.types import ProgramHint
from radixmesh.lang import bridge
from radixmesh.lang.backend.base import Backend
from radixmesh.lang.backend.registry import resolve_backend
from radixmesh.lang.global_config import global_config
from radixmesh.lang.interpreter import StreamExecutor
from radixmesh.lang.state import ProgramState
from radixmesh.lang.tracer import TracerState, constant_prefix, trace_program

logger = logging.getLogger(__name__)


def _defaults(
    max_new_tokens: int = 128,
    n: int = 1,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = -1,
    min_p: float = 0.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    ignore_eos: bool = False,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
) -> dict[str, Any]:
    """The run-wide sampling defaults (SGLang's), in the engine's names."""
    params = dict(locals())
    params.pop("return_text_in_logprobs")  # text is always returned with logprobs
    return {k: v for k, v in params.items() if v is not None}


class SglFunction:
    def __init__(
        self,
        func: Callable[..., Any],
        num_api_spec_tokens: int | None = None,
        bind_arguments: dict[str, Any] | None = None,
    ) -> None:
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = bind_arguments or {}
        params = list(inspect.signature(func).parameters)
        if not params:
            raise TypeError(
                f"@function {func.__name__} must take the program state as its first argument"
            )
        self.arg_names = params[1:]
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: Any) -> SglFunction:
        unknown = sorted(set(kwargs) - set(self.arg_names))
        if unknown:
            raise TypeError(f"{self.func.__name__}() has no argument {unknown[0]!r} to bind")
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Called on a state from inside another program: run inline on that state.
        if args and isinstance(args[0], ProgramState | TracerState):
            return self.func(args[0], *args[1:], **{**self.bind_arguments, **kwargs})
        return self.run(*args, **kwargs)

    # ---- running --------------------------------------------------------------------

    def run(
        self,
        *args: Any,
        max_new_tokens: int = 128,
        n: int = 1,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        stream: bool = False,
        backend: object | None = None,
        use_thread: bool = True,
        **kwargs: Any,
    ) -> ProgramState:
        """Run once (SGLang's arguments: the run-wide sampling defaults, then the
        program's own). With stream=True the state returns at once for text_iter()."""
        sampling = _sampling(locals())
        arguments = self._arguments(args, kwargs)
        return run_program(
            self, resolve_backend(backend), arguments, sampling, stream, use_thread=use_thread
        )

    async def run_async(
        self, *args: Any, backend: object | None = None, **kwargs: Any
    ) -> ProgramState:
        """`run` for asyncio: the finished state, without blocking the event loop.

        The program's body runs on this loop's thread in a greenlet: where it reads a
        variable the model has not written yet, it yields to the loop until the value is
        there. The model calls run as tasks on this loop over the backend's asyncio
        client, so any number of programs run at once on one thread."""
        sampling, arguments = self._split(kwargs)
        arguments = self._arguments(args, arguments)
        return await _run_async(self, resolve_backend(backend), arguments, sampling)

    async def run_batch_async(
        self,
        batch_kwargs: list[dict[str, Any]] | list[list[Any]],
        *,
        backend: object | None = None,
        **kwargs: Any,
    ) -> list[ProgramState]:
        """`run_batch` for asyncio: every program at once on this loop, after the
        template's prefill. A failing program keeps its error on its state."""
        sampling, extra = self._split(kwargs)
        if extra:
            raise TypeError(
                f"run_batch_async() got an unexpected keyword argument {next(iter(extra))!r}"
            )
        be = resolve_backend(backend)
        batch = self._batch(batch_kwargs)
        program = None
        if len(batch) > 1 and global_config.enable_precache_with_tracing:
            prefix = self.traced_prefix(be)
            if prefix:
                program = be.program_hint(prefix)
                await be.acache_prefix(prefix, program)
        runs = (_run_async(self, be, a, sampling, program) for a in batch)
        return list(await asyncio.gather(*runs))

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]] | list[list[Any]],
        *,
        max_new_tokens: int = 128,
        n: int = 1,
        stop: str | list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        stop_regex: str | list[str] | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        min_p: float = 0.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        ignore_eos: bool = False,
        return_logprob: bool | None = None,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        return_text_in_logprobs: bool | None = None,
        backend: object | None = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
    ) -> Any:
        """Run once per argument dict (or list of positional arguments). A failing program
        keeps its error on its state. `generator_style`: yield the states in order as
        they finish instead of returning the list."""
        sampling = _sampling(locals())
        be = resolve_backend(backend)
        batch = self._batch(batch_kwargs)
        program = None
        if len(batch) > 1 and global_config.enable_precache_with_tracing:
            prefix = self.traced_prefix(be)
            if prefix:
                program = be.program_hint(prefix)  # the batch's requests stay together
                be.cache_prefix(prefix, program)
        threads = _num_threads(num_threads, len(batch))
        states = _run_all(self, be, batch, sampling, threads, progress_bar, program)
        return states if generator_style else list(states)

    def cache(self, backend: object | None = None) -> str:
        """Prefill the program's constant prefix on `backend` (SGLang's name for precache)."""
        return self.precache(resolve_backend(backend))

    def _batch(self, batch_kwargs: Any) -> list[dict[str, Any]]:
        if not isinstance(batch_kwargs, list | tuple):
            raise ValueError("batch_kwargs: expected a list of dicts of program arguments")
        batch = []
        for item in batch_kwargs:
            if isinstance(item, dict):
                batch.append(self._arguments((), item))
            elif isinstance(item, list | tuple):  # positional arguments, as in SGLang
                batch.append(self._arguments(tuple(item), {}))
            else:
                raise ValueError(
                    "batch_kwargs: expected a list of dicts (or lists) of program arguments"
                )
        return batch

    def trace(self, *, backend: object | None = None, **kwargs: Any) -> TracerState:
        """The program's graph; arguments not given are placeholders."""
        return trace_program(self, kwargs)

    def precache(self, backend: Backend) -> str:
        """Prefill the program's constant prefix; returns it ("" if tracing failed)."""
        prefix = self.traced_prefix(backend)
        if prefix:
            backend.cache_prefix(prefix)
        return prefix

    def traced_prefix(self, backend: Backend) -> str:
        """The text every run starts with, by tracing ("" if the tracer cannot follow)."""
        try:
            return constant_prefix(trace_program(self, {}), backend.chat_template)
        except Exception as e:  # a program the tracer cannot follow just runs uncached
            logger.debug("tracing %s failed: %s", self.func.__name__, e)
            return ""

    # ---- helpers --------------------------------------------------------------------

    def _split(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        names = set(inspect.signature(_defaults).parameters)
        sampling = {k: v for k, v in kwargs.items() if k in names}
        return _defaults(**sampling), {k: v for k, v in kwargs.items() if k not in names}

    def _arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        try:
            bound = inspect.signature(self.func).bind(
                None, *args, **{**self.bind_arguments, **kwargs}
            )
        except TypeError as e:
            raise TypeError(f"{self.func.__name__}(): {e}") from None
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop(next(iter(arguments)))  # the state
        return arguments


def _sampling(given: dict[str, Any]) -> dict[str, Any]:
    """The run-wide sampling defaults from a run method's arguments."""
    names = inspect.signature(_defaults).parameters
    return _defaults(**{k: given[k] for k in names})


def run_program(
    fn: SglFunction,
    backend: Backend,
    arguments: dict[str, Any],
    default_params: dict[str, Any],
    stream: bool,
    wait: bool = True,
    use_thread: bool = True,
    program: ProgramHint | None = None,
) -> ProgramState:
    """Run the body now; with `stream` and `use_thread`, in a thread of its own so the
    state returns at once (SGLang's streaming run) and text_iter follows it."""
    executor = StreamExecutor(
        backend, arguments, default_params, stream, num_api_spec_tokens=fn.num_api_spec_tokens
    )
    executor.program = program
    state = ProgramState(executor)
    if stream and use_thread:
        threading.Thread(
            target=_body, args=(fn, state, arguments), name="radixmesh-program", daemon=True
        ).start()
        return state
    _body(fn, state, arguments)
    if wait and not stream:
        executor.sync()
    return state


def _body(fn: SglFunction, state: ProgramState, arguments: dict[str, Any]) -> None:
    """The program's function on its state; what it raises is kept on the state."""
    executor = state.stream_executor
    try:
        state.ret_value = fn.func(state, **arguments)
    except Exception as e:  # kept on the state: the batch goes on
        executor.sync()
        executor.fail(e)
    finally:
        executor.end()
    if global_config.verbosity >= 2:
        executor.sync()
        print(executor.text_)


def _run_all(
    fn: SglFunction,
    backend: Backend,
    batch: list[dict[str, Any]],
    sampling: dict[str, Any],
    threads: int,
    progress_bar: bool,
    program: ProgramHint | None = None,
) -> Iterator[ProgramState]:
    """The batch's states in order, each yielded once its program finished."""
    bar = None
    if progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(batch))
    with ThreadPoolExecutor(threads) as pool:
        futures = [
            pool.submit(run_program, fn, backend, a, sampling, False, True, True, program)
            for a in batch
        ]
        for f in futures:
            state = f.result()
            if bar is not None:
                bar.update()
            yield state
    if bar is not None:
        bar.close()


async def _run_async(
    fn: SglFunction,
    backend: Backend,
    arguments: dict[str, Any],
    default_params: dict[str, Any],
    program: ProgramHint | None = None,
) -> ProgramState:
    executor = StreamExecutor(
        backend,
        arguments,
        default_params,
        num_api_spec_tokens=fn.num_api_spec_tokens,
        loop=asyncio.get_running_loop(),
    )
    executor.program = program
    state = ProgramState(executor)
    await bridge.run_body(lambda: _body(fn, state, arguments))
    await executor.wait_finished()
    return state


def _num_threads(num_threads: int | str, batch_size: int) -> int:
    if num_threads == "auto":  # SGLang's count: the programs mostly wait on the model
        return max(1, min(batch_size, max(96, 16 * (os.cpu_count() or 1))))
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads: expected 'auto' or an integer >= 1, got {num_threads!r}")
    return num_threads


def function(func: Callable[..., Any] | None = None, num_api_spec_tokens: int | None = None) -> Any:
    """Decorator: `@function` or `@function(num_api_spec_tokens=...)`."""
    if func is not None:
        return SglFunction(func, num_api_spec_tokens)
    return lambda f: SglFunction(f, num_api_spec_tokens)

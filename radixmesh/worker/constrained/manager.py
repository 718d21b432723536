"""What the worker calls for constrained requests: validate, attach, mask, advance.

Lifecycle of a constrained request:
1. `check(params)` (the caller's thread): the constraint's size, nesting and repetition
   against the limits (limits.py), at once.
2. `prepare(params)`: a future that settles when the constraint has compiled (in the
   compile pool's processes, compile_pool.py) or failed: then with an InvalidArgument
   naming the field and quoting the compiler, or with `Internal` when no compile process
   could run it (the server's failure, not the constraint's). The engine queues the
   request only after it settles, without a thread waiting for it (`validate` waits:
   for sync callers).
3. `attach(req)` (scheduler.add_request): the request holds its compile future;
   admission skips it while `pending(req)` (the batch never waits for a compile).
4. `jump_at_start(req, output)` (admission): the text forced before any choice is
   appended before the first step, so the prefill computes it.
5. `fill_bitmask(reqs)` (model runner): one `[M, W]` int32 mask for the sampled rows that
   are constrained.
6. `append(req, token, ...)` (process_output): the matcher accepts the sampled token,
   the forced string after it is appended without decode steps (jump-forward), and a
   terminated or dead-end grammar finishes the request.

The backend (the tokenizer's vocabulary read into the grammar library, ~0.5 s for
smollm2 with xgrammar's import) is built once per worker. `warmup()` starts that build
on a background thread at engine start, so the first constrained request waits only on
what is left of it; without warmup the first request builds it. The compile processes
start with the first compile (~2 s on a CPU: they import the grammar library once).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from radixmesh.errors import InvalidArgument, Overloaded
from radixmesh.sampling_params import SamplingParams
from radixmesh.worker.constrained.bitmask import allocate_bitmask
from radixmesh.worker.constrained.compile_cache import Announce, CompileCache, GrammarEventKind
from radixmesh.worker.constrained.compile_pool import CompileLimits, CompilePool
from radixmesh.worker.constrained.cost import CompileCost
from radixmesh.worker.constrained.grammar import (
    CompileStopped,
    GrammarBackend,
    GrammarError,
    Matcher,
    fill_each,
)
from radixmesh.worker.constrained.jump_forward import apply_jump, retokenize
from radixmesh.worker.constrained.limits import ConstraintLimits
from radixmesh.worker.constrained.registry import create_grammar_backend
from radixmesh.worker.constrained.request_grammar import RequestGrammar
from radixmesh.worker.constrained.vocab import vocab_of
from radixmesh.worker.request import FinishReason, Request

_LABELS = {
    "regex": "regex",
    "json_schema": "JSON schema",
    "ebnf": "EBNF grammar",
    "choices": "choices",
    "structural_tag": "structural tag",
}
# Compiler messages quote the constraint; gRPC carries an error's message in a trailer
# (~16 KB in all), so a long one is cut here.
MAX_MESSAGE_CHARS = 1000


class TokenAppender(Protocol):  # OutputProcessor.append_token / append_forced
    def append_token(
        self,
        req: Request,
        token: int,
        logprob: float | None,
        top: list[tuple[int, float]] | None,
    ) -> None: ...

    def append_forced(self, req: Request, tokens: list[int]) -> None: ...


@dataclass
class GrammarStats:
    requests: int = 0
    forced_tokens: int = 0
    jump_forwards: int = 0
    sampled_tokens: int = 0
    dead_ends: int = 0


class GrammarManager:
    """Owns the grammar backend (built by `warmup()` or on first use) and its compile
    cache."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Iterable[int],
        *,
        backend: str = "xgrammar",
        jump_forward: bool = True,
        compile_timeout: float = 30.0,
        compile_processes: int = 2,
        compile_memory_bytes: int = 1 << 30,
        max_costly_compiles: int = 4,
        limits: ConstraintLimits | None = None,
    ) -> None:
        """`compile_processes` = 0 compiles on a thread in this process (no time or memory
        limit: for tests of the manager alone)."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(stop_token_ids)
        self.backend_name = backend
        self.jump_forward = jump_forward  # the ablation switch; may be flipped at runtime
        self.limits = limits or ConstraintLimits()
        self.compile_limits = CompileLimits(
            compile_timeout,
            compile_memory_bytes,
            compile_processes,
            max_compiled_bytes=self.limits.max_compiled_bytes,
            max_costly=max_costly_compiles,
        )
        self._pool: CompilePool | None = None
        self._cache: CompileCache | None = None
        self._build: Future[CompileCache] | None = None  # the backend build, once started
        self._token_bytes: list[bytes | None] = []
        self._lock = threading.Lock()
        self.stats = GrammarStats()
        # Hears each grammar that compiled into the cache / left it, with its key
        # (compile_cache.py's `announce`): the engine tells the routers. Set before the
        # first constrained request.
        self.on_change: Announce | None = None

    # ---- compile ----------------------------------------------------------------------

    def warmup(self) -> Future[CompileCache]:
        """Start building the backend and its compile cache on a background thread (once;
        later calls return the same future). A failed build is not kept: the next use
        tries again and raises the same GrammarError as it would without warmup."""
        with self._lock:
            if self._build is None:
                pool = ThreadPoolExecutor(1, thread_name_prefix="radixmesh-grammar-build")
                self._build = pool.submit(self._build_cache)
                pool.shutdown(wait=False)  # its one thread ends after the build
            return self._build

    @property
    def build(self) -> Future[CompileCache] | None:
        """The backend build once started (by warmup or a first use); None before."""
        return self._build

    @property
    def ready(self) -> bool:
        """True once the backend is built (by warmup or a first constrained request)."""
        return self._cache is not None

    @property
    def cache(self) -> CompileCache:
        if self._cache is not None:
            return self._cache
        build = self.warmup()
        try:
            return build.result()
        except BaseException:
            with self._lock:
                if self._build is build and build.done():  # failed: the next use retries
                    self._build = None
            raise

    def _build_cache(self) -> CompileCache:
        vocab = vocab_of(self.tokenizer, self.vocab_size, self.stop_token_ids)
        if vocab is None:
            raise GrammarError("constrained decoding needs a tokenizer whose token bytes are known")
        try:
            backend: GrammarBackend = create_grammar_backend(self.backend_name, vocab)
        except ImportError as e:
            raise GrammarError(f"the {self.backend_name} backend is not installed ({e})") from e
        self._token_bytes = vocab.token_bytes
        submit = None
        if self.compile_limits.processes:
            self._pool = CompilePool(backend.compiler_spec(), self.compile_limits)
            submit = self._pool.submit
        self._cache = CompileCache(backend, vocab.name, submit=submit, announce=self._announce)
        return self._cache

    def _announce(self, kind: GrammarEventKind, key: int) -> None:
        if self.on_change is not None:
            self.on_change(kind, key)

    @property
    def compiles(self) -> int:
        """Constraints compiled so far (misses of the compiled cache)."""
        return self._cache.misses if self._cache is not None else 0

    def compile(self, kind: str, text: str, cost: CompileCost | None = None) -> Future[Any]:
        return self.cache.get(kind, text, cost)

    def check(self, params: SamplingParams) -> CompileCost | None:
        """The constraint against the limits, at once; InvalidArgument naming the field.
        Returns its estimated compile cost (None without a constraint)."""
        constraint = params.constraint
        if constraint is None:
            return None
        kind, text = constraint
        return self.limits.check(kind, text)

    def prepare(self, params: SamplingParams) -> Future[None] | None:
        """Check and start compiling the constraint (None without one): the future settles
        when it compiled, or with an InvalidArgument naming the field. Raises Overloaded
        when it is costly and the compile pool has as many costly compiles as it takes
        (compile_pool.py): the router tries another worker."""
        cost = self.check(params)
        constraint = params.constraint
        if constraint is None:
            return None
        kind, text = constraint
        done: Future[None] = Future()
        try:
            compiling = self.compile(kind, text, cost)
        except GrammarError as e:  # no usable tokenizer
            done.set_exception(_invalid(kind, e))
            return done

        def settle(f: Future[Any]) -> None:
            error = f.exception()
            if error is None:
                done.set_result(None)
            elif isinstance(error, GrammarError):
                done.set_exception(_invalid(kind, error))
            else:
                done.set_exception(error)

        compiling.add_done_callback(settle)
        return done

    def validate(self, params: SamplingParams) -> None:
        """`prepare` and wait (sync callers and tests; the engine waits on no thread)."""
        done = self.prepare(params)
        if done is not None:
            done.result()

    # ---- requests ---------------------------------------------------------------------

    def attach(self, req: Request) -> None:
        constraint = req.params.constraint
        if constraint is None or req.grammar is not None:
            return
        kind, text = constraint
        try:
            future = self.compile(kind, text)
        except GrammarError as e:  # no usable tokenizer
            future = Future()
            future.set_exception(e)
        except Overloaded as e:  # dropped from the cache since prepare, and the pool is full
            future = Future()
            future.set_exception(CompileStopped(f"was not compiled: {e}"))
        req.grammar = RequestGrammar(kind, future)
        self.stats.requests += 1

    def pending(self, req: Request) -> bool:
        """True while `req`'s grammar compiles. When done, builds its matcher or records
        the compile error (`req.grammar.error`) for the scheduler to finish it with."""
        g = req.grammar
        if g is None or g.matcher is not None or g.error is not None:
            return False
        if not g.future.done():
            return True
        try:
            g.matcher = self.cache.backend.matcher(g.future.result())
        except GrammarError as e:
            g.error = _invalid(g.kind, e).message
        except Exception as e:  # no compile process (compile_pool's Internal): the server's
            g.error = str(e)
        return False

    def fill_bitmask(self, reqs: Sequence[Request], *, pin: bool = False) -> torch.Tensor:
        """`[len(reqs), W]` int32 allowed-token mask, one row per constrained request
        (in pinned host memory with `pin`).

        A row with no allowed token is a dead end: the request is marked and its row
        allows everything (its sample is discarded; `append` finishes it)."""
        bits = allocate_bitmask(len(reqs), self.vocab_size, pin=pin)
        matchers: list[Matcher] = []
        for req in reqs:
            g = req.grammar
            assert g is not None and g.matcher is not None
            matchers.append(g.matcher)
        if self._cache is not None:  # the backend may fill the rows in parallel
            self._cache.backend.fill_bitmasks(matchers, bits)
        else:  # matchers made without this manager's backend
            fill_each(matchers, bits)
        for j, allows in enumerate(bits.ne(0).any(dim=1).tolist()):
            if not allows:
                g = reqs[j].grammar
                assert g is not None
                g.dead_end = True
                bits[j].fill_(-1)
        return bits

    def check_draft(self, req: Request, draft: list[int]) -> tuple[list[int], torch.Tensor]:
        """Speculative decoding: the longest prefix of `draft` the request's grammar
        allows, and the allowed tokens at each of its positions and at the one after it
        (`[len(prefix) + 1, W]` int32: row j is the state after the prefix's first j
        tokens, for verifying the row's samples). The matcher ends where it started."""
        g = req.grammar
        assert g is not None and g.matcher is not None
        m = g.matcher
        bits = allocate_bitmask(len(draft) + 1, self.vocab_size)
        n = 0
        while True:
            m.fill_bitmask(bits, n)
            if n == len(draft) or m.is_terminated() or not m.accept_token(draft[n]):
                break
            n += 1
        if n:
            m.rollback(n)
        if not bool(bits[n].ne(0).any()):  # a dead end after the prefix: let `append` say so
            bits[n].fill_(-1)
        return draft[:n], bits[: n + 1]

    def append(
        self,
        req: Request,
        token: int,
        logprob: float | None,
        top: list[tuple[int, float]] | None,
        output: TokenAppender,
    ) -> None:
        """Accept the sampled token, append it and any forced tokens, finish when done."""
        g = req.grammar
        assert g is not None and g.matcher is not None
        if g.dead_end or not g.matcher.accept_token(token):
            self._dead_end(req, g)
            return
        g.num_sampled += 1
        self.stats.sampled_tokens += 1
        tokens = [token]
        if self.jump_forward and not g.matcher.is_terminated():
            tokens = self._jump(g, token)
        forced = tokens
        if tokens[0] == token:  # else jump-forward's retokenization replaced it
            output.append_token(req, token, logprob, top)
            forced = tokens[1:]
        if forced and not req.finished:  # probability 1 under the constraint
            output.append_forced(req, forced)
        if req.finished:
            return
        if g.matcher.is_terminated():
            req.finish(FinishReason.STOP, token)

    def jump_at_start(self, req: Request, output: TokenAppender) -> None:
        """Before a request's first step, append the text its grammar forces at the start
        (a JSON template's `{"first_key": "`), so that its prefill computes that text too
        and samples the first free token: one step sooner than sampling `{` and then
        jumping. Runs once per request, and only before it has any output."""
        g = req.grammar
        if g is None or g.matcher is None or g.started:
            return
        g.started = True
        if not self.jump_forward or req.num_output_tokens or g.matcher.is_terminated():
            return
        forced = g.matcher.jump_forward_string()
        if not forced:
            return
        tokens = self.tokenizer.encode(forced)
        if b"".join(self._token_bytes[t] or b"\xff" for t in tokens) != forced.encode():
            return  # not text that round-trips through the tokenizer
        for k, t in enumerate(tokens):
            if not g.matcher.accept_token(t):
                g.matcher.rollback(k)
                return
        g.num_jumps += 1
        self.stats.jump_forwards += 1
        for t in tokens:
            output.append_token(req, t, None, None)
            g.num_forced_tokens += 1  # counted as appended: a request may finish inside
            self.stats.forced_tokens += 1
            if req.finished:
                return

    def _jump(self, g: RequestGrammar, token: int) -> list[int]:
        assert g.matcher is not None
        forced = g.matcher.jump_forward_string()
        if not forced:
            return [token]
        jump = retokenize(self.tokenizer.encode, self._token_bytes, token, forced)
        if jump is None or not jump.tokens or not apply_jump(g.matcher, token, jump):
            return [token]
        g.num_jumps += 1
        g.num_forced_tokens += jump.num_forced
        self.stats.jump_forwards += 1
        self.stats.forced_tokens += jump.num_forced
        return jump.tokens if jump.replaces_sampled else [token, *jump.tokens]

    def _dead_end(self, req: Request, g: RequestGrammar) -> None:
        self.stats.dead_ends += 1
        req.error = f"the {_LABELS[g.kind]} allows no next token (grammar dead end)"
        req.finish(FinishReason.ABORT)

    def shutdown(self) -> None:
        if self._cache is not None:
            self._cache.shutdown()
        if self._pool is not None:
            self._pool.shutdown()


def _invalid(kind: str, error: GrammarError) -> InvalidArgument:
    """The request's error for a constraint that did not compile: the compiler's words,
    cut to MAX_MESSAGE_CHARS."""
    why = str(error)
    if len(why) > MAX_MESSAGE_CHARS:
        why = f"{why[:MAX_MESSAGE_CHARS]}... ({len(why) - MAX_MESSAGE_CHARS} more characters)"
    if isinstance(error, CompileStopped):
        return InvalidArgument(kind, f"the {_LABELS[kind]} {why}")
    return InvalidArgument(kind, f"invalid {_LABELS[kind]}: {why}")

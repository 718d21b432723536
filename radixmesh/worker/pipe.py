"""The engine process's pipe: a typed message per command and result, and their encoding.

`EngineProcess` (engine_process.py) talks to its child over two one-way pipes. What may
cross them is listed here, one `NamedTuple` per message type:

- commands, server -> child, one message per frame: `Submit`, `Abort`, `AbortAll`,
  `Drain`, `Call`, `Shutdown` (`encode_command` / `decode_command`);
- results, child -> server, one frame per burst (everything the child had to send since
  its last send, in order): `Out`, `Error`, `Event`, `Result`, `Raise`, `Fatal`, and at
  start `Ready` or `Failed` alone (`encode_results` / `decode_results`).

Decisions and their reasons:

- msgpack, each message a flat array `[tag, field, ...]` in a fixed order: no key names on
  the wire, the tag names the schema. A `RequestOutput` (with its `MetaInfo`, `Finish`,
  `GrammarCounts`) is inlined into its `Out` row; a `CacheEvent`'s kind is a small code.
  On the hot path (a burst of up to 256 step outputs, and cache events) this is faster
  than pickling the dataclasses and a third to half the bytes (bench/engine_pipe.py,
  docs/performance.md "The engine pipe"): pickle writes each object's attribute names
  and rebuilds it by its reduce protocol, where here a row is built and read back by
  straight-line code, and msgpack's C packer does the rest.
- Decoding rebuilds each dataclass by its constructor (not by filling `__dict__`), so a
  decoded value is built the way the engine builds it; the one exception is the frozen
  `CacheEvent` (see `_event`), whose constructor cost more than pickle's whole decode.
- Escape: `Result` values and the `Ready` configuration travel pickled inside their typed
  envelope. They are rare (a stats poll, a flush, a cache snapshot per subscriber; one
  `Ready` per start), their types are our own dataclasses (`EngineConfig`, `EngineInfo`,
  `SchedulerStats`, lists of `CacheEvent`) that grow fields often, and the set of calls
  is open (`Call` names any engine method): a schema per result would be a second copy of
  each of those types to keep in step, for no gain where speed does not matter. Both
  ends are the same program (the server and the child it spawned), so unpickling what
  the child sends trusts nothing that the process does not already run.
- Sampling parameters (`Submit.params`) are plain values, as the gRPC server builds them
  (`wire.params_from_proto`): a value msgpack cannot carry (an object, an int beyond 64
  bits) is `InvalidArgument` naming the parameter; a tuple arrives as a list.
- Strings may carry lone surrogates (`surrogatepass`), as they could under pickle.
- A frame that does not decode (truncated, garbled, an unknown tag, a message of the
  wrong length) raises `FrameError`. The decoder checks a frame's structure, not every
  field's type: the two ends are one program, and the check is against corruption, not
  against a hostile peer; the hot path stays straight-line.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, get_args

import msgpack

from radixmesh.errors import InvalidArgument
from radixmesh.worker.config import EngineConfig
from radixmesh.worker.engine_info import EngineInfo
from radixmesh.worker.kvcache.events import CacheEvent, CacheEventKind
from radixmesh.worker.request_output import Finish, GrammarCounts, MetaInfo, RequestOutput

# An error as plain values (our errors do not pickle): gRPC status name, message, field.
PackedError = tuple[str, str, str | None]


class FrameError(ValueError):
    """A frame on the engine pipe that does not decode to its messages."""


# ---- commands: server -> child ---------------------------------------------------------------


class Submit(NamedTuple):
    """Start a request: a generation, or with `pooling` an embedding."""

    rid: str
    input_ids: list[int]
    params: dict[str, Any]
    pooling: str | None
    delivery: str = "steps"  # a `Delivery` value: which outputs come back


class Abort(NamedTuple):
    rid: str


class AbortAll(NamedTuple):
    reason: str


class Drain(NamedTuple):
    """Take no new requests; finish the running ones."""


class Call(NamedTuple):
    """Run the engine's method `name(*args)`; its value comes back as `Result(cid, ...)`
    (or `Raise`). The arguments are plain values."""

    cid: int
    name: str
    args: tuple[Any, ...]


class Shutdown(NamedTuple):
    """Stop the engine and exit."""


Command = Submit | Abort | AbortAll | Drain | Call | Shutdown

# ---- results: child -> server ----------------------------------------------------------------


class Out(NamedTuple):
    """One scheduler step's output for the request `rid`."""

    rid: str
    output: RequestOutput


class Error(NamedTuple):
    """The request `rid` failed (a bad submission, a grammar that did not compile)."""

    rid: str
    error: PackedError


class Event(NamedTuple):
    event: CacheEvent


class Result(NamedTuple):
    """A call's value (pickled on the pipe: see the module docstring)."""

    cid: int
    value: Any


class Raise(NamedTuple):
    """A call's error."""

    cid: int
    error: PackedError


class Fatal(NamedTuple):
    """The engine can no longer serve, and why."""

    message: str


class Ready(NamedTuple):
    """The engine serves: its resolved configuration (pickled on the pipe)."""

    config: EngineConfig
    info: EngineInfo


class Failed(NamedTuple):
    """The engine did not start."""

    error: PackedError


ResultMessage = Out | Error | Event | Result | Raise | Fatal | Ready | Failed

# ---- tags ------------------------------------------------------------------------------------

_SUBMIT, _ABORT, _ABORT_ALL, _DRAIN, _CALL, _SHUTDOWN = range(6)
_OUT, _ERROR, _EVENT, _RESULT, _RAISE, _FATAL, _READY, _FAILED = range(8)
_EVENT_KINDS: tuple[CacheEventKind, ...] = get_args(CacheEventKind)
_EVENT_CODE = {kind: code for code, kind in enumerate(_EVENT_KINDS)}
_GRAMMAR_KINDS = frozenset(("grammar_compiled", "grammar_evicted"))
_EVENT_KIND = dict(enumerate(_EVENT_KINDS))  # a bad code is a KeyError (not a wrap-around)
_UNICODE = "surrogatepass"


def _pack(rows: Any) -> bytes:
    return msgpack.packb(rows, use_bin_type=True, unicode_errors=_UNICODE)


def _unpack(frame: bytes, *, use_list: bool) -> Any:
    try:
        return msgpack.unpackb(
            frame, use_list=use_list, raw=False, strict_map_key=False, unicode_errors=_UNICODE
        )
    except Exception as e:  # OutOfData, ExtraData, FormatError, StackError, ...
        raise FrameError(f"engine pipe: a frame of {len(frame)} bytes does not decode: {e}") from e


# ---- commands' encoding ----------------------------------------------------------------------


def encode_command(msg: Command) -> bytes:
    """One command as one frame. A submission whose ids or parameters are not plain values
    raises InvalidArgument naming the field."""
    if isinstance(msg, Submit):
        try:
            return _pack((_SUBMIT, msg.rid, msg.input_ids, msg.params, msg.pooling, msg.delivery))
        except (TypeError, ValueError, OverflowError):
            raise _unencodable(msg) from None
    if isinstance(msg, Abort):
        return _pack((_ABORT, msg.rid))
    if isinstance(msg, AbortAll):
        return _pack((_ABORT_ALL, msg.reason))
    if isinstance(msg, Drain):
        return _pack((_DRAIN,))
    if isinstance(msg, Call):
        return _pack((_CALL, msg.cid, msg.name, msg.args))
    if isinstance(msg, Shutdown):
        return _pack((_SHUTDOWN,))
    raise TypeError(f"not a command of the engine pipe: {msg!r}")


def _unencodable(msg: Submit) -> InvalidArgument:
    """The field of a submission that msgpack cannot carry."""
    for name, value in (("request_id", msg.rid), ("input_ids", msg.input_ids)):
        if not _encodes(value):
            return InvalidArgument(name, f"{name} must be plain values, not {value!r:.80}")
    for key, value in msg.params.items():
        if not isinstance(key, str | int) or not _encodes(value):
            return InvalidArgument(
                str(key), f"the sampling parameter {key!r} is not a plain value: {value!r:.80}"
            )
    return InvalidArgument("pooling", f"pooling must be a string, not {msg.pooling!r:.80}")


def _encodes(value: Any) -> bool:
    try:
        _pack(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def decode_command(frame: bytes) -> Command:
    """A command frame's message; raises FrameError if it is not one."""
    row = _unpack(frame, use_list=True)
    try:
        tag = row[0]
        if tag == _SUBMIT:
            _, rid, ids, params, pooling, delivery = row
            return Submit(rid, ids, params, pooling, delivery)
        if tag == _ABORT:
            _, rid = row
            return Abort(rid)
        if tag == _ABORT_ALL:
            _, reason = row
            return AbortAll(reason)
        if tag == _DRAIN and len(row) == 1:
            return Drain()
        if tag == _CALL:
            _, cid, name, args = row
            return Call(cid, name, tuple(args))
        if tag == _SHUTDOWN and len(row) == 1:
            return Shutdown()
    except (TypeError, ValueError, IndexError, KeyError) as e:
        raise FrameError(f"engine pipe: a malformed command {_short(row)}: {e}") from None
    raise FrameError(f"engine pipe: not a command: {_short(row)}")


# ---- results' encoding -----------------------------------------------------------------------


def encode_results(msgs: Iterable[ResultMessage]) -> bytes:
    """A burst of results as one frame, in order."""
    rows: list[Any] = []
    add = rows.append
    for msg in msgs:
        if isinstance(msg, Out):
            add(_output_row(msg.rid, msg.output))
        elif isinstance(msg, Event):
            ev = msg.event
            # (a grammar event has no blocks: its keys travel in the blocks' place)
            hashes = ev.grammar_keys or ev.block_hashes
            add((_EVENT, _EVENT_CODE[ev.kind], hashes, ev.parent_hash, ev.num_tokens))
        elif isinstance(msg, Error):
            add((_ERROR, msg.rid, *msg.error))
        elif isinstance(msg, Result):
            add((_RESULT, msg.cid, pickle.dumps(msg.value, pickle.HIGHEST_PROTOCOL)))
        elif isinstance(msg, Raise):
            add((_RAISE, msg.cid, *msg.error))
        elif isinstance(msg, Fatal):
            add((_FATAL, msg.message))
        elif isinstance(msg, Ready):
            add((_READY, pickle.dumps((msg.config, msg.info), pickle.HIGHEST_PROTOCOL)))
        elif isinstance(msg, Failed):
            add((_FAILED, *msg.error))
        else:
            raise TypeError(f"not a result of the engine pipe: {msg!r:.200}")
    return _pack(rows)


def decode_results(frame: bytes) -> list[ResultMessage]:
    """A burst frame's messages, in order; raises FrameError if it is not one."""
    rows = _unpack(frame, use_list=False)
    if not isinstance(rows, tuple):
        raise FrameError(f"engine pipe: a burst is an array of messages, not {_short(rows)}")
    out: list[ResultMessage] = []
    add = out.append
    row: Any = None
    try:
        for row in rows:
            tag = row[0]
            if tag == _OUT:
                add(Out(row[1], _output(row)))
            elif tag == _EVENT:
                _, kind, hashes, parent, num_tokens = row
                add(Event(_event(_EVENT_KIND[kind], hashes, parent, num_tokens)))
            elif tag == _ERROR:
                _, rid, status, message, field = row
                add(Error(rid, (status, message, field)))
            elif tag == _RESULT:
                _, cid, payload = row
                add(Result(cid, pickle.loads(payload)))
            elif tag == _RAISE:
                _, cid, status, message, field = row
                add(Raise(cid, (status, message, field)))
            elif tag == _FATAL:
                _, message = row
                add(Fatal(message))
            elif tag == _READY:
                _, payload = row
                config, info = pickle.loads(payload)
                add(Ready(config, info))
            elif tag == _FAILED:
                _, status, message, field = row
                add(Failed((status, message, field)))
            else:
                raise FrameError(f"engine pipe: not a result: {_short(row)}")
    except FrameError:
        raise
    except Exception as e:  # wrong arity, a bad code, a payload that does not unpickle
        raise FrameError(f"engine pipe: a malformed result {_short(row)}: {e!r}") from None
    return out


def _short(value: Any) -> str:
    return f"{value!r:.120}"


def _event(kind: str, hashes: tuple[int, ...], parent: int | None, num_tokens: int) -> CacheEvent:
    """A CacheEvent built as unpickling builds one, its `__dict__` filled directly: a frozen
    dataclass's `__init__` sets each field through `object.__setattr__` (0.9 us an event
    against 0.35 us), which made decoding a burst of events slower than pickle's."""
    ev = object.__new__(CacheEvent)
    d = ev.__dict__
    d["kind"] = kind
    d["block_hashes"] = hashes
    d["parent_hash"] = parent
    d["num_tokens"] = num_tokens
    if kind in _GRAMMAR_KINDS:  # (the fields left unset read the class's defaults)
        d["block_hashes"], d["grammar_keys"] = (), hashes
    return ev


# ---- RequestOutput as a row ------------------------------------------------------------------
# [tag, rid, output rid (None: rid), new_token_ids, text_delta, finished, new_token_logprobs,
#  new_top_logprobs, error, embedding, meta id (None: rid), prompt_tokens, completion_tokens,
#  cached_tokens, finish (None or [reason, matched, length, message]), e2e_latency,
#  queue_time, prefill_time, decode_time, num_retractions, grammar (None or [forced,
#  jumps, steps]), spec_verify_steps, spec_drafted_tokens, spec_accepted_tokens,
#  output_token_logprobs, output_top_logprobs, input_token_logprobs,
#  input_top_logprobs]: MetaInfo's fields in its own order. Logprob entries are arrays,
#  read back as tuples (the frame decodes with arrays as tuples; lists are rebuilt).


def _output_row(rid: str, o: RequestOutput) -> tuple[Any, ...]:
    m = o.meta_info
    f = m.finish
    g = m.grammar
    return (
        _OUT,
        rid,
        None if o.rid == rid else o.rid,
        o.new_token_ids,
        o.text_delta,
        o.finished,
        o.new_token_logprobs,
        o.new_top_logprobs,
        o.error,
        o.embedding,
        None if m.id == rid else m.id,
        m.prompt_tokens,
        m.completion_tokens,
        m.cached_tokens,
        None if f is None else (f.reason, f.matched, f.length, f.message),
        m.e2e_latency,
        m.queue_time,
        m.prefill_time,
        m.decode_time,
        m.num_retractions,
        None if g is None else (g.forced_tokens, g.jump_forwards, g.decode_steps),
        m.spec_verify_steps,
        m.spec_drafted_tokens,
        m.spec_accepted_tokens,
        m.output_token_logprobs,
        m.output_top_logprobs,
        m.input_token_logprobs,
        m.input_top_logprobs,
    )


def _output(row: Sequence[Any]) -> RequestOutput:
    (_, rid, orid, ids, text, finished, lps, tops, error, embedding, mid, prompt, completion,
     cached, finish, e2e, queue, prefill, decode, retractions, grammar, verify_steps,
     drafted, accepted, olp, otop, ilp, itop) = row  # fmt: skip
    meta = MetaInfo(
        rid if mid is None else mid,
        prompt,
        completion,
        cached,
        None if finish is None else Finish(*finish),
        e2e,
        queue,
        prefill,
        decode,
        retractions,
        None if grammar is None else GrammarCounts(*grammar),
        verify_steps,
        drafted,
        accepted,
        None if olp is None else list(olp),
        None if otop is None else [list(t) for t in otop],
        None if ilp is None else list(ilp),
        None if itop is None else [list(t) for t in itop],
    )
    return RequestOutput(
        rid if orid is None else orid,
        list(ids),
        text,
        finished,
        meta,
        list(lps),
        [list(t) for t in tops],
        error,
        None if embedding is None else list(embedding),
    )

"""The engine pipe's encoding against pickle: what a burst of results costs to cross.

The worker's engine runs in a child process (radixmesh/worker/engine_process.py) that
sends the server one frame per burst: a scheduler step's outputs for every running
request, and cache events. Until the pipe was typed (radixmesh/worker/pipe.py) a burst
was a pickled list of tuples (`Connection.send`); now it is a msgpack frame of
fixed-order arrays (`encode_results` / `decode_results`, `send_bytes` / `recv_bytes`).
For bursts of N = 1, 64 and 256 messages this times, for both:

  encode  build the messages (tuples / typed messages, as the child's scheduler thread
          does) and encode them: the child's CPU per burst (its sender thread shares
          the interpreter lock with the scheduler thread)
  decode  decode a frame back to objects: the server's CPU per burst (its reader thread
          shares the interpreter lock with the gRPC event loop)
  pipe    build, encode, send over a real `multiprocessing.Pipe` to a child that echoes
          the bytes back, receive and decode (so the bytes cross twice)
  bytes   the frame's size

Workloads (the outputs as `worker/output.py` builds them):
  decode    one new token and a few characters per request, mid-stream (the hot case)
  logprobs  the same with the token's logprob and its top 5
  final     finished outputs: a finish reason and the phase times
  events    "stored" cache events of 4 block hashes each

Each figure is the best of `--repeats` (the machine may be shared: noise only adds time),
the two encodings interleaved. Prints a table and writes JSON to bench/results/.
Run: `.venv/bin/python -m bench.engine_pipe [--repeats 300]`.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import pickle
import random
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import msgpack

from bench import record
from radixmesh.worker.kvcache.events import CacheEvent
from radixmesh.worker.pipe import Event, Out, ResultMessage, decode_results, encode_results
from radixmesh.worker.request_output import Finish, MetaInfo, RequestOutput

SIZES = (1, 64, 256)
WORKLOADS = ("decode", "logprobs", "final", "events")


def _outputs(workload: str, n: int, rng: random.Random) -> list[RequestOutput]:
    outs = []
    for i in range(n):
        rid = f"{rng.getrandbits(128):032x}"
        tok = rng.randrange(49152)
        meta = MetaInfo(id=rid, prompt_tokens=200 + i, completion_tokens=37, cached_tokens=128)
        lps: list[Any] = []
        tops: list[Any] = []
        if workload == "logprobs":
            lps = [(-rng.random(), tok, None)]
            tops = [[(-rng.random() * k, rng.randrange(49152), None) for k in range(1, 6)]]
        if workload == "final":
            meta.finish = Finish("length", None, 37)
            meta.e2e_latency, meta.queue_time = 1.0 + rng.random(), rng.random() / 100
            meta.prefill_time, meta.decode_time = rng.random() / 10, 1.0 + rng.random()
        outs.append(RequestOutput(rid, [tok], " word", workload == "final", meta, lps, tops))
    return outs


def _events(n: int, rng: random.Random) -> list[CacheEvent]:
    return [
        CacheEvent("stored", tuple(rng.getrandbits(64) for _ in range(4)), rng.getrandbits(64), 64)
        for _ in range(n)
    ]


def _cases(workload: str, n: int, rng: random.Random) -> tuple[Callable[[], Any], ...]:
    """(build the pickled path's burst, build the typed burst) for one workload."""
    if workload == "events":
        evs = _events(n, rng)
        return (lambda: [("event", e) for e in evs]), (lambda: [Event(e) for e in evs])
    outs = _outputs(workload, n, rng)
    return (lambda: [("out", o.rid, o) for o in outs]), (lambda: [Out(o.rid, o) for o in outs])


def _echo(inbox: Connection, outbox: Connection, parents: tuple[Connection, ...]) -> None:
    """The far end: every frame straight back, undecoded, until the parent closes its end
    (the forked copies of the parent's ends are closed first, or that never shows)."""
    for conn in parents:
        conn.close()
    try:
        while True:
            outbox.send_bytes(inbox.recv_bytes())
    except EOFError:
        pass


def _best(fns: list[Callable[[], Any]], repeats: int) -> list[float]:
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return [b * 1e6 for b in best]


def _row(
    build_old: Callable[[], Any],
    build_new: Callable[[], list[ResultMessage]],
    send: Connection,
    recv: Connection,
    repeats: int,
) -> dict[str, Any]:
    old_frame = bytes(ForkingPickler.dumps(build_old()))
    new_frame = encode_results(build_new())

    def encode_pickle() -> Any:
        return ForkingPickler.dumps(build_old())

    def encode_msgpack() -> bytes:
        return encode_results(build_new())

    def decode_pickle() -> Any:
        return pickle.loads(old_frame)

    def decode_msgpack() -> list[ResultMessage]:
        return decode_results(new_frame)

    def pipe_pickle() -> Any:
        send.send(build_old())  # what the child did: a pickled list of tuples
        return recv.recv()

    def pipe_msgpack() -> list[ResultMessage]:
        send.send_bytes(encode_results(build_new()))
        return decode_results(recv.recv_bytes())

    assert pipe_msgpack() == build_new() and pipe_pickle() == build_old()
    fns = [encode_pickle, encode_msgpack, decode_pickle, decode_msgpack, pipe_pickle, pipe_msgpack]
    ep, em, dp, dm, pp, pm = _best(fns, repeats)
    return {
        "bytes_pickle": len(old_frame),
        "bytes_msgpack": len(new_frame),
        "encode_us_pickle": round(ep, 1),
        "encode_us_msgpack": round(em, 1),
        "decode_us_pickle": round(dp, 1),
        "decode_us_msgpack": round(dm, 1),
        "codec_speedup": round((ep + dp) / (em + dm), 2),
        "pipe_us_pickle": round(pp, 1),
        "pipe_us_msgpack": round(pm, 1),
        "pipe_speedup": round(pp / pm, 2),
    }


def measure(repeats: int, seed: int = 0) -> list[dict[str, Any]]:
    ctx = mp.get_context("fork")
    to_child, send = ctx.Pipe(duplex=False)
    recv, from_child = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_echo, args=(to_child, from_child, (send, recv)), daemon=True)
    child.start()
    to_child.close()
    from_child.close()
    rng = random.Random(seed)
    rows = []
    try:
        for workload in WORKLOADS:
            for n in SIZES:
                build_old, build_new = _cases(workload, n, rng)
                row = _row(build_old, build_new, send, recv, repeats)
                rows.append({"workload": workload, "n": n, **row})
    finally:
        send.close()
        child.join(timeout=10)
        recv.close()
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    """Each pair: pickle / msgpack; x: pickle's time over msgpack's (codec: encode + decode)."""
    keys = ("bytes", "encode_us", "decode_us", "pipe_us")
    names = " ".join(f"{k.replace('_us', ' us'):>17}" for k in keys)
    lines = [f"{'workload':9} {'N':>4} {names}  codec x  pipe x"]
    for r in rows:
        pairs = " ".join(f"{_pair(r, k):>17}" for k in keys)
        lines.append(
            f"{r['workload']:9} {r['n']:>4} {pairs} {r['codec_speedup']:>8} {r['pipe_speedup']:>7}"
        )
    return "\n".join(lines)


def _pair(row: dict[str, Any], key: str) -> str:
    return f"{row[key + '_pickle']} / {row[key + '_msgpack']}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeats", type=int, default=300, help="best of this many, per figure")
    record.add_output_arguments(ap)
    args = ap.parse_args(argv)
    rows = measure(args.repeats)
    print(_table(rows))
    figures = {
        "msgpack": msgpack.__version__,
        "pickle_protocol": pickle.DEFAULT_PROTOCOL,
        "rows": rows,
    }
    record.write("engine_pipe", args, figures)


if __name__ == "__main__":
    main()

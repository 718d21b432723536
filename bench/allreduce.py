"""All-reduce of a decode step's activations across a TP group: NCCL against PyTorch's
symmetric-memory one-shot all-reduce, eager and inside a CUDA graph (as the decode graph
holds them: 2 per layer).

Each rank is a process on its own GPU. For each size `[B, hidden]` bf16: microseconds per
call, eager loop and graph replay of --calls calls, and whether the sums are right.
Multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1): the one-shot
kernel reads the peers' buffers over NVLink (P2P loads), no multimem.

  python -m bench.allreduce --world 2            # two H200s
Writes JSON (--out) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from datetime import timedelta
from typing import Any

import torch

from bench import record


def _rank(rank: int, world: int, port: int, args: dict[str, Any], q: Any) -> None:
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0)
    dist.init_process_group(
        "nccl",
        store=store,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
        device_id=device,
    )
    group = dist.group.WORLD
    assert group is not None
    name = group.group_name
    out: dict[str, Any] = {"impls": {}}
    hidden, calls = args["hidden"], args["calls"]
    symm: Any = None
    try:
        import torch.distributed._symmetric_memory as symm_mem

        buf = symm_mem.empty(max(args["batches"]) * hidden, dtype=torch.bfloat16, device=device)
        symm_mem.rendezvous(buf, name)
        symm = buf
    except Exception as e:
        out["symm_error"] = f"{type(e).__name__}: {e}"

    def nccl(x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x

    def one_shot(x: torch.Tensor) -> torch.Tensor:
        view = symm[: x.numel()].view_as(x)
        view.copy_(x)
        if hasattr(torch.ops.symm_mem, "one_shot_all_reduce_out"):
            torch.ops.symm_mem.one_shot_all_reduce_out(view, "sum", name, x)
        else:
            x.copy_(torch.ops.symm_mem.one_shot_all_reduce(view, "sum", name))
        return x

    impls = {"nccl": nccl}
    if symm is not None:
        impls["symm_one_shot"] = one_shot
    for impl, fn in impls.items():
        res: dict[str, Any] = {}
        for b in args["batches"]:
            entry: dict[str, Any] = {"bytes": b * hidden * 2}
            try:
                x = torch.full((b, hidden), float(rank + 1), dtype=torch.bfloat16, device=device)
                fn(x)
                torch.cuda.synchronize()
                entry["correct"] = bool((x == world * (world + 1) / 2).all().item())
                for _ in range(10):
                    fn(x.fill_(1.0))
                torch.cuda.synchronize()
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn(x)
                torch.cuda.synchronize()
                entry["eager_us"] = (time.perf_counter() - t0) / calls * 1e6
                y = torch.ones((b, hidden), dtype=torch.bfloat16, device=device)
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    fn(y)
                torch.cuda.current_stream().wait_stream(s)
                torch.cuda.synchronize()
                one, many = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
                with torch.cuda.graph(one, capture_error_mode="thread_local"):
                    fn(y)
                with torch.cuda.graph(many, capture_error_mode="thread_local"):
                    for _ in range(calls):
                        fn(y)
                y.fill_(float(rank + 1))
                torch.cuda.synchronize()
                dist.barrier()
                one.replay()
                torch.cuda.synchronize()
                entry["graph_correct"] = bool((y == world * (world + 1) / 2).all().item())
                dist.barrier()
                many.replay()  # warm-up (the values overflow: only time matters now)
                torch.cuda.synchronize()
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(5):
                    many.replay()
                torch.cuda.synchronize()
                entry["graph_us"] = (time.perf_counter() - t0) / (5 * calls) * 1e6
            except Exception as e:
                entry["error"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
            res[str(b)] = entry
        out["impls"][impl] = res
    if rank == 0:
        q.put(out)
    dist.barrier()
    os._exit(0)  # NCCL teardown can hang (radixmesh/worker/tp/leader.py)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--calls", type=int, default=64)
    record.add_output_arguments(ap)
    a = ap.parse_args(argv)
    import torch.multiprocessing as mp

    from radixmesh.cluster.launch import free_port

    params = {
        "hidden": a.hidden,
        "calls": a.calls,
        "batches": [int(b) for b in a.batches.split(",")],
    }
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, a.world, port, params, q)) for r in range(a.world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    res = q.get() if not q.empty() else {"error": [p.exitcode for p in procs]}
    print(json.dumps(res, indent=1))
    record.write("allreduce", a, {"result": res})


if __name__ == "__main__":
    main()

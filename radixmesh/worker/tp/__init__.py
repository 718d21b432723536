"""Tensor parallelism across processes: one worker is one TP group.

Rank 0 lives in the worker process (scheduler, radix cache, gRPC server, sampling); it
spawns ranks 1..N-1 and feeds them (`leader.py`, rank 0's side); they run only the model
forward (`follower.py`, the other ranks' side). Every step rank 0 sends the batch
description over a pipe and the KV slot tables over the process group, and all ranks run
the forward in lockstep (`step.py`). The layers shard themselves
(`radixmesh/worker/layers/`); nothing here knows the model.
"""

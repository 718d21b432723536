"""The SDK's channels to one target, and the stubs each call takes from them in turn.

A target of several routers (`host:port,host:port`) is one channel whose round_robin
balancer sends each call to the next READY router (options.channel_options).
`connections=N` opens N such channels, each with its own connections, and rotates calls
over them: router replicas that share one port through SO_REUSEPORT get connections,
not calls, from the kernel, so one connection would keep every call on one replica.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc

from radixmesh.v1 import router_pb2_grpc, worker_pb2_grpc

from .options import ClientOptions, channel_options, channel_target


@dataclass(frozen=True)
class Stubs:
    """One channel's stubs (the channel is a `grpc.Channel` or a `grpc.aio.Channel`)."""

    channel: Any
    worker: worker_pb2_grpc.WorkerStub
    router: router_pb2_grpc.RouterStub
    health: health_pb2_grpc.HealthStub

    @classmethod
    def of(cls, channel: Any) -> Stubs:
        return cls(
            channel,
            worker_pb2_grpc.WorkerStub(channel),
            router_pb2_grpc.RouterStub(channel),
            health_pb2_grpc.HealthStub(channel),
        )


class Channels:
    """`options.connections` channels to `target`, sync (`grpc`) or asyncio (`grpc.aio`).

    `next()` hands out the channels' stubs round robin, safe across threads: each call
    (and each retry of it) takes the next, so a retry also leaves the connection that
    failed. The caller closes the channels (`channels()`)."""

    def __init__(self, target: str, options: ClientOptions, *, aio: bool = False) -> None:
        address = channel_target(target)
        args = channel_options(address, options.connections)
        grpc_module: Any = grpc.aio if aio else grpc
        self._stubs: list[Stubs] = []
        for _ in range(options.connections):
            if options.secure:
                ch = grpc_module.secure_channel(address, options.credentials(), args)
            else:
                ch = grpc_module.insecure_channel(address, args)
            self._stubs.append(Stubs.of(ch))
        self._turn = itertools.count()  # next() on a count is atomic under the GIL

    def next(self) -> Stubs:
        if len(self._stubs) == 1:
            return self._stubs[0]
        return self._stubs[next(self._turn) % len(self._stubs)]

    def channels(self) -> list[Any]:
        return [s.channel for s in self._stubs]


class StubsInTurn:
    """`_worker`, `_router`, `_health` for a client holding `_channels`: each access takes
    the next connection's stub (one per call, and one per retry)."""

    _channels: Channels

    @property
    def _worker(self) -> worker_pb2_grpc.WorkerStub:
        return self._channels.next().worker

    @property
    def _router(self) -> router_pb2_grpc.RouterStub:
        return self._channels.next().router

    @property
    def _health(self) -> health_pb2_grpc.HealthStub:
        return self._channels.next().health

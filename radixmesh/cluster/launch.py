"""The local launcher: N worker processes and M routers on one machine, stopped together.

`radixmesh launch` starts each worker as `radixmesh worker` on its own loopback port and
`routers` router replicas as `radixmesh router` in front of them, waits until the routers'
health check says SERVING (which needs a worker up and the tokenizer loaded) and the
routers see every worker healthy, and then serves until SIGINT / SIGTERM, when it stops
every child (SIGTERM, then SIGKILL after `stop_timeout`). A child that dies meanwhile is
restarted (child.py: backoff, at most `restart.max_restarts` times within
`restart.restart_window` seconds) while the others serve on; the launcher gives up only when no
worker or no router is left.

Router replicas share the router's gRPC and HTTP ports (SO_REUSEPORT: the kernel spreads
new connections over them) and each subscribes to every worker's cache events, so each
routes by the same exact summaries. Each gets its own metrics port (`metrics_port` + its
index), since a Prometheus scrape must reach one process.

Workers always require a key: the given `worker_api_key` or one generated at launch,
handed to workers and router in their environment, never on a command line (`ps`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

from radixmesh.cluster.child import Child
from radixmesh.cluster.env import (
    ADMIN_KEY_ENV,
    API_KEY_ENV,
    PARENT_PID_ENV,
    WORKER_API_KEY_ENV,
)
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.errors import InvalidArgument, Unavailable

# Where `free_port` picks: above the well-known ports and Ray's worker ports (10002-19999),
# below the kernel's ephemeral range (Linux's default starts at 32768).
PICK_LOW = 20_000
EPHEMERAL_PATH = "/proc/sys/net/ipv4/ip_local_port_range"


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a server started next, outside the kernel's ephemeral
    range where it can: a port the kernel hands out (bind to port 0) can be taken by any
    process's outgoing connection or bind(0) between this pick and the server's bind, and
    clients of a server that held it before may still be calling it. Picked at random in
    [PICK_LOW, the range's start) from the system's randomness (processes forked with one
    `random` state would pick alike) and checked by binding it; where the range leaves no
    room below it, the kernel's pick."""
    start = _ephemeral_start()
    rng = secrets.SystemRandom()
    for _ in range(100 if start > PICK_LOW + 1000 else 0):
        port = rng.randrange(PICK_LOW, start)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:  # taken (or on another address of the same port)
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# Ports this process's `free_port` returned: two picks before either server binds (a gRPC
# port and an HTTP port for one launch) would otherwise both pass the bind check and could
# be the same port. Never cleared: a process picks a few hundred ports at most.
_HANDED_OUT: set[int] = set()


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (IANA's 49152 where unreadable)."""
    try:
        with open(EPHEMERAL_PATH) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def gpu_ids(c: LaunchSpec) -> list[str]:
    """The GPUs the workers are spread over: CUDA_VISIBLE_DEVICES, else all detected."""
    base = c.env if c.env is not None else os.environ
    if visible := base.get("CUDA_VISIBLE_DEVICES"):
        return visible.split(",")
    count = c.visible_gpus if c.visible_gpus is not None else c.workers * c.gpus_per_worker
    return [str(i) for i in range(count)]


def check_gpus(c: LaunchSpec) -> None:
    """InvalidArgument, before anything starts, when the workers need more GPUs than exist."""
    g, k = c.gpus_per_worker, c.workers_per_gpu
    if g == 0:
        return
    have = len(gpu_ids(c))
    need = -(-c.workers // k) * g  # ceil(workers / k) groups of g GPUs
    if need > have:
        share = -(-c.workers * g // have) if have else 0
        hint = f"; --workers-per-gpu {share} lets {share} workers share each GPU" if have else ""
        raise InvalidArgument(
            "workers",
            f"{c.workers} workers x {g} GPUs ({k} per GPU) need {need} GPUs; "
            f"{have} {'is' if have == 1 else 'are'} visible{hint}",
        )


def worker_gpu_env(c: LaunchSpec, index: int) -> dict[str, str] | None:
    """Worker `index`'s environment: its own slice of the visible GPUs when
    `gpus_per_worker` is set (so two TP-2 workers on four GPUs do not share cuda:0-1),
    shared with the `workers_per_gpu` - 1 workers next to it."""
    g = c.gpus_per_worker
    if g == 0:
        return c.env
    check_gpus(c)
    base = c.env if c.env is not None else os.environ
    group = index // c.workers_per_gpu
    mine = gpu_ids(c)[group * g : (group + 1) * g]
    return {**base, "CUDA_VISIBLE_DEVICES": ",".join(mine)}


def worker_args(c: LaunchSpec) -> tuple[str, ...]:
    """Flags every worker gets beyond model and address: its TP size, the memory share of
    a shared GPU."""
    args = c.worker_args
    if c.tp_size > 1:
        args = (*args, "--tp-size", str(c.tp_size))
    if c.gpus_per_worker and c.workers_per_gpu > 1:
        return ("--gpu-memory-share", f"{1 / c.workers_per_gpu:.6f}", *args)
    return args


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "radixmesh.cluster.cli", *args]


def wait_router_ready(
    address: str,
    timeout: float,
    dead: Callable[[], str | None] = lambda: None,
    stop_requested: Callable[[], bool] = lambda: False,
    *,
    api_key: str | None = None,
    root_certificates: bytes | None = None,
    routers: int = 1,
) -> bool:
    """Block until `routers` router replicas at `address` serve and see every worker
    healthy (True), or until `stop_requested()` (False); Unavailable if `dead()` names a
    dead part of the cluster or `timeout` seconds pass. `root_certificates`: connect with
    TLS. Replicas sharing the address are told apart by the `router_id` they report; each
    check opens a new connection, which the kernel hashes to one of them."""
    import grpc

    from radixmesh.v1 import router_pb2

    deadline = time.monotonic() + timeout
    metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
    ready: set[str] = set()
    while time.monotonic() < deadline:
        if stop_requested():
            return False
        if (gone := dead()) is not None:
            raise Unavailable(f"{gone} exited during startup")
        try:
            resp = _ready_router(address, root_certificates, metadata)
        except grpc.RpcError:
            resp = None
        if isinstance(resp, router_pb2.ClusterStatusResponse):
            ready.add(resp.router_id)
            if len(ready) >= routers:
                return True
            time.sleep(0.02)  # then another connection: maybe another replica
            continue
        time.sleep(0.2)
    raise Unavailable(f"the cluster was not ready within {timeout}s")


def _ready_router(
    address: str, root_certificates: bytes | None, metadata: tuple[tuple[str, str], ...]
) -> object | None:
    """The ClusterStatus of the router replica a new connection reaches, if it serves and
    sees every worker healthy; else None."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from radixmesh.v1 import router_pb2, router_pb2_grpc

    options = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own
    channel = (
        grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates), options)
        if root_certificates is not None
        else grpc.insecure_channel(address, options)
    )
    with channel as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=1
        )
        if resp.status != health_pb2.HealthCheckResponse.SERVING:
            return None
        status = router_pb2_grpc.RouterStub(ch).ClusterStatus(
            router_pb2.ClusterStatusRequest(), timeout=1, metadata=metadata
        )
        return status if all(w.healthy for w in status.workers) else None


class LocalCluster:
    """The processes of one local cluster. Use as a context manager, or start() / stop().

    `failure()` (which `supervise` calls every 0.2 s) also restarts dead children."""

    def __init__(self, config: LaunchSpec) -> None:
        self.config = config
        self.worker_ports = list(config.worker_ports) or [
            free_port(config.host) for _ in range(config.workers)
        ]
        self.worker_key = config.worker_api_key or secrets.token_urlsafe(32)
        self.worker_children = [
            Child(f"worker {i}", functools.partial(self._launch_worker, i), config.restart)
            for i in range(config.workers)
        ]
        self.router_children = self._router_children()

    def _router_children(self) -> list[Child]:
        n = self.config.routers
        return [
            Child(
                "the router" if n == 1 else f"router {i}",
                functools.partial(self._launch_router, i),
                self.config.restart,
            )
            for i in range(n)
        ]

    @property
    def workers(self) -> list[subprocess.Popen[bytes]]:
        """Each worker's current process (a restarted worker's newest)."""
        return [c.proc for c in self.worker_children if c.proc is not None]

    @property
    def routers(self) -> list[subprocess.Popen[bytes]]:
        """Each router replica's current process."""
        return [c.proc for c in self.router_children if c.proc is not None]

    @property
    def router(self) -> subprocess.Popen[bytes] | None:
        """The first router replica's current process."""
        return self.router_children[0].proc

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.config.port}"

    @property
    def worker_addresses(self) -> list[str]:
        return [f"{self.config.host}:{p}" for p in self.worker_ports]

    def start(self) -> None:
        self.start_workers()
        self.start_router()

    def start_workers(self) -> None:
        check_gpus(self.config)
        for child in self.worker_children:
            child.start()

    def _launch_worker(self, i: int) -> subprocess.Popen[bytes]:
        c = self.config
        args = ["worker", "--model", c.model, "--host", c.host]
        args += ["--port", str(self.worker_ports[i])]
        env = dict(worker_gpu_env(c, i) or (c.env if c.env is not None else os.environ))
        env[API_KEY_ENV] = self.worker_key  # the worker's own key, whatever the user's
        env[PARENT_PID_ENV] = str(os.getpid())  # it stops if this process dies (parent.py)
        return subprocess.Popen(_cli(*args, *worker_args(c)), env=env)

    def start_router(self) -> None:
        self.router_children = self._router_children()
        for child in self.router_children:
            child.start()

    def _launch_router(self, index: int = 0) -> subprocess.Popen[bytes]:
        c = self.config
        router_args = [
            "router",
            "--workers",
            ",".join(self.worker_addresses),
            "--host",
            c.host,
            "--port",
            str(c.port),
            "--policy",
            c.policy,
        ]
        if c.tls_cert is not None and c.tls_key is not None:
            router_args += ["--tls-cert", c.tls_cert, "--tls-key", c.tls_key]
        router_args += c.replica_flags(index)  # (several: shared ports, cold partition)
        env = dict(c.env if c.env is not None else os.environ)
        env.pop(API_KEY_ENV, None)  # only the keys given to the launcher
        if c.api_keys:
            env[API_KEY_ENV] = ",".join(c.api_keys)
        if c.admin_keys:
            env[ADMIN_KEY_ENV] = ",".join(c.admin_keys)
        env[WORKER_API_KEY_ENV] = self.worker_key
        env[PARENT_PID_ENV] = str(os.getpid())
        flags = c.router_flags()
        metrics_port = c.router_options.get("metrics_port")
        if index and metrics_port:
            flags = _replace_flag(flags, "--metrics-port", str(int(metrics_port) + index))
        return subprocess.Popen(_cli(*router_args, *flags), env=env)

    def replace_router(self, policy: str, options: dict[str, Any] | None = None) -> None:
        """Stop the routers and start them with another routing policy (and `options`
        over the router options) in front of the same workers (their caches stay as they
        are), then wait until they are ready."""
        _stop(self.routers, self.config.stop_timeout)
        router_options = {**self.config.router_options, **(options or {})}
        self.config = dataclasses.replace(self.config, policy=policy, router_options=router_options)
        self.start_router()
        self.wait_ready()

    def wait_ready(self, stop_requested: Callable[[], bool] = lambda: False) -> bool:
        """Block until the router serves and sees every worker healthy (True), or until
        `stop_requested()` (False); Unavailable if a child dies or time runs out."""
        c = self.config
        root = None
        if c.tls_cert is not None:
            with open(c.tls_cert, "rb") as f:
                root = f.read()
        keys = c.admin_keys or c.api_keys
        return wait_router_ready(
            self.address,
            c.ready_timeout,
            self.dead_child,
            stop_requested,
            api_key=keys[0] if keys else None,
            root_certificates=root,
            routers=c.routers,
        )

    def ready_line(self) -> str:
        n = self.config.routers
        routers = f"router {self.address}" if n == 1 else f"{n} routers on {self.address}"
        return f"radixmesh cluster ready: {routers}, workers {', '.join(self.worker_addresses)}"

    def failure(self) -> str | None:
        """Restart the children that died (see child.py); why the cluster must stop (no
        worker left, or no router), or None."""
        for child in [*self.worker_children, *self.router_children]:
            child.tend()
        if all(c.gave_up for c in self.worker_children):
            return "every worker exited for good"
        if all(c.gave_up for c in self.router_children):
            return "every router exited for good"
        return None

    def dead_child(self) -> str | None:
        for child in [*self.worker_children, *self.router_children]:
            if (dead := child.dead()) is not None:
                return dead
        return None

    def stop(self) -> None:
        for child in [*self.router_children, *self.worker_children]:
            child.stop_restarting()  # what exits now was stopped, not dead
        _stop([*self.routers, *self.workers], self.config.stop_timeout)

    def __enter__(self) -> LocalCluster:
        try:
            self.start()  # inside: a failed start stops the processes it did start
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _replace_flag(flags: list[str], flag: str, value: str) -> list[str]:
    """`flags` with `flag`'s value replaced (it is given as `flag value`)."""
    out = list(flags)
    i = out.index(flag)
    out[i + 1] = value
    return out


def _stop(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERM each process, then SIGKILL whatever still runs after `timeout` seconds."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Supervised(Protocol):
    """What `supervise` runs: a cluster that starts, gets ready, is checked and stops."""

    def start(self) -> None: ...
    def wait_ready(self, stop_requested: Callable[[], bool]) -> bool: ...
    def ready_line(self) -> str: ...
    def failure(self) -> str | None: ...  # why the cluster must stop (status 1), or None
    def stop(self) -> None: ...


def supervise(cluster: Supervised, check_every: float = 0.2) -> int:
    """Run `cluster` until SIGINT / SIGTERM (status 0) or its `failure()` (status 1),
    then stop it and restore the signal handlers. Shared by the local and Ray launchers."""
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, on_signal) for s in signals}
    try:
        cluster.start()
        for s in signals:  # start may have replaced them (ray.init installs a sys.exit)
            signal.signal(s, on_signal)
        if not cluster.wait_ready(lambda: stopping):
            return 0
        print(cluster.ready_line(), flush=True)
        checked = float("-inf")
        while not stopping:
            if time.monotonic() - checked >= check_every:
                checked = time.monotonic()
                if (why := cluster.failure()) is not None:
                    print(f"radixmesh: {why}; stopping the cluster", file=sys.stderr)
                    return 1
            time.sleep(0.2)
        return 0
    finally:
        cluster.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)


def launch(config: LaunchSpec) -> int:
    """Run a local cluster until SIGINT / SIGTERM, or until no worker or no router is left
    (restarts used up). Returns the status."""
    return supervise(LocalCluster(config))

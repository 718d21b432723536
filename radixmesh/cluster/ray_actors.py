"""Ray mode's actors and their placement helpers (ray_launch.py has the whole picture).

`WorkerActor` owns a `radixmesh worker` subprocess and a thread that ends the actor when
the subprocess dies; `GpuReservation` holds one more GPU bundle of a tensor-parallel
worker; `RouterActor` serves the router (router/server.py) on a loop in a thread of the
actor. They are plain classes: `ray.remote` wraps them in `RayCluster.start`, so this
module imports Ray only inside the actors' methods.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from radixmesh.cluster.launch import free_port
from radixmesh.cluster.spec import LaunchSpec, RayOptions

_PR_SET_PDEATHSIG = 1
_ANY_HOST = ("0.0.0.0", "::", "")


def advertised_host(bind_host: str, node_ip: str) -> str:
    """The address others reach a server at: the node's IP when it binds every interface."""
    return node_ip if bind_host in _ANY_HOST else bind_host


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the process that started it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "radixmesh.cluster.cli", *args]


class WorkerActor:
    """One worker: a `radixmesh worker` subprocess on a free port of this node, with its
    /metrics on another free port (or on `metrics_port`, when given). `name` (worker-i, as
    the routers name it) is its repr: Ray's state API and dashboard show it as the actor's
    repr name, and its log lines carry it."""

    def __init__(
        self,
        model: str,
        host: str,
        worker_args: tuple[str, ...],
        stop_timeout: float,
        gpu_peers: list[Any] | None = None,
        metrics_port: int | None = None,
        api_key: str | None = None,
        name: str = "",
    ) -> None:
        import ray

        from radixmesh.cluster.env import API_KEY_ENV

        self.name = name
        self.stop_timeout = stop_timeout
        bind = host if host not in _ANY_HOST else "0.0.0.0"
        self.port = free_port(bind)
        if metrics_port is None:  # a free one too, other than the gRPC port
            metrics_port = self.port
            while metrics_port == self.port:
                metrics_port = free_port(bind)
        self.metrics_port = metrics_port
        advertised = advertised_host(host, ray.util.get_node_ip_address())
        self._address = f"{advertised}:{self.port}"
        self._metrics_address = f"{advertised}:{self.metrics_port}"
        env = dict(os.environ)
        if api_key is not None:  # in the environment, never on the command line
            env[API_KEY_ENV] = api_key
        if gpu_peers:  # tensor parallelism: this actor's GPU plus each reservation's
            # Asked anew on every (re)start: handles outlive a restart, results may not.
            peer_ids = ray.get([p.gpu_ids.remote() for p in gpu_peers])
            gpus = [*ray.get_gpu_ids(), *(g for ids in peer_ids for g in ids)]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        args = ["worker", "--model", model, "--host", host, "--port", str(self.port)]
        args += ["--metrics-port", str(self.metrics_port)]
        self.proc = subprocess.Popen(
            _cli(*args, *worker_args), env=env, preexec_fn=_die_with_parent
        )
        self._stopping = False
        threading.Thread(target=self._watch, name="watch-worker", daemon=True).start()

    def _watch(self) -> None:
        status = self.proc.wait()
        if not self._stopping:  # the worker died: so does the actor, and Ray restarts it
            print(f"radixmesh worker exited ({status}); restarting", file=sys.stderr, flush=True)
            os._exit(1)

    def __repr__(self) -> str:
        return self.name or type(self).__name__

    def address(self) -> str:
        return self._address

    def metrics_address(self) -> str:
        """host:port of this worker's Prometheus /metrics, as of its latest (re)start."""
        return self._metrics_address

    def node_id(self) -> str:
        """The Ray node this actor runs on (after a restart: where it was placed again)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def actor_id(self) -> str:
        """This actor's Ray id (hex), as Ray's state API and dashboard list it."""
        import ray

        return str(ray.get_runtime_context().get_actor_id())

    def pids(self) -> tuple[int, int]:
        """(the actor's process, the worker subprocess)."""
        return os.getpid(), self.proc.pid

    def stop(self) -> int | None:
        """SIGTERM the worker (it drains), SIGKILL after `stop_timeout`. Its exit status."""
        self._stopping = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class GpuReservation:
    """Holds one more rank's resources of a worker (in its placement group) and says which
    GPUs Ray gave it. `name` (worker-i rank r) is its repr, as WorkerActor's."""

    def __init__(self, name: str = "") -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name or type(self).__name__

    def node_id(self) -> str:
        """The Ray node this reservation holds resources on (the worker's, by its bundle)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def gpu_ids(self) -> list[int | str]:
        import ray

        return list(ray.get_gpu_ids())


class RouterActor:
    """Router `index` of the cluster: the router's `serve()` on an event loop in a thread
    of this actor. `placement_group`: the routers' spread group (None: on the driver's node).
    Its repr (Ray's state API and dashboard) is router-i."""

    def __init__(
        self,
        config: LaunchSpec,
        workers: list[Any],
        index: int = 0,
        placement_group: Any = None,
    ) -> None:
        import ray

        from radixmesh import log_limit
        from radixmesh.router.pool import WorkerPool
        from radixmesh.router.server import serve

        self.index = index
        log_limit.configure()  # as `radixmesh router`: at most a burst a place an interval
        addresses = tuple(ray.get([w.address.remote() for w in workers]))
        router_config = config.router_config(addresses, index)
        if router_config.metrics_port is not None:  # the one port routers cannot share
            hosts = _router_hosts(config.routers, placement_group)
            port = router_config.metrics_port + host_rank(hosts, index)
            router_config = dataclasses.replace(router_config, metrics_port=port)
        node_ip = ray.util.get_node_ip_address()
        host = advertised_host(config.host, node_ip)
        self._address = f"{host}:{config.port}"
        self._metrics_address = (
            None if router_config.metrics_port is None else f"{host}:{router_config.metrics_port}"
        )
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._serving = asyncio.Event()
        self._error: BaseException | None = None
        timeout = (config.ray or RayOptions()).resolve_timeout
        resolvers = [self._resolver(w, timeout) for w in workers]
        created = threading.Event()

        async def main() -> None:
            # gRPC aio channels belong to the loop they are made on: make the pool here.
            self.pool = WorkerPool(router_config, resolvers)
            created.set()
            await serve(router_config, self._serving, pool=self.pool, stop=self._stop)

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(main())
            except BaseException as e:  # e.g. its metrics port taken: `ready` reports it
                self._error = e
                created.set()

        self._thread = threading.Thread(target=run, name="router", daemon=True)
        self._thread.start()
        created.wait()

    @staticmethod
    def _resolver(worker: Any, timeout: float) -> Callable[[], Any]:
        async def resolve() -> str | None:
            return str(await asyncio.wait_for(worker.address.remote(), timeout))

        return resolve

    def __repr__(self) -> str:
        return f"router-{self.index}"

    def address(self) -> str:
        return self._address

    def metrics_address(self) -> str | None:
        """host:port of this router's Prometheus /metrics (None: off)."""
        return self._metrics_address

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def ready(self) -> bool:
        """True once this router serves and sees every worker healthy. Raises what ended
        `serve()` if it ended without being stopped."""
        if not self._thread.is_alive():
            e = self._error
            why = f"{type(e).__name__}: {e}" if e is not None else "stopped"
            raise RuntimeError(f"the router at {self._address} ended: {why}")

        async def check() -> bool:
            return self._serving.is_set() and all(w.healthy for w in self.pool.workers.values())

        try:
            return asyncio.run_coroutine_threadsafe(check(), self._loop).result(timeout=10)
        except (TimeoutError, RuntimeError):
            # serve() may have ended just after the check above (its loop closed or
            # stopped): say why it ended, not that the question went unanswered.
            self._thread.join(timeout=2.0)
            if not self._thread.is_alive():
                return self.ready()
            # Its loop is alive but did not answer within 10 s (still starting on a loaded
            # node): not ready yet, and asked again. Raising here failed the whole start.
            return False

    def summaries(self) -> dict[str, dict[str, Any]]:
        """Per worker: the address the router uses, the state of its prefix summary and the
        router's requests on it now."""

        async def read() -> dict[str, dict[str, Any]]:
            return {
                wid: {
                    "address": w.address,
                    "healthy": w.healthy,
                    "epoch": w.summary.epoch,
                    "sequence": w.summary.sequence,
                    "resyncs": w.resyncs,
                    "cached_blocks": w.summary.num_confirmed,
                    "in_flight": w.in_flight,
                }
                for wid, w in self.pool.workers.items()
            }

        return asyncio.run_coroutine_threadsafe(read(), self._loop).result(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)


def host_rank(hosts: list[str | None], index: int) -> int:
    """How many routers before router `index` run on its host: its metrics port is the
    configured one plus this, so that routers sharing a machine (one node, or fake nodes
    of one machine) do not collide while one router per machine keeps the port itself."""
    return hosts[:index].count(hosts[index])


def _router_hosts(routers: int, placement_group: Any) -> list[str | None]:
    """The host of each router: the driver's node for all, or its spread bundle's node
    (asked anew at each (re)start: a bundle moves when its node dies)."""
    import ray

    if placement_group is None:
        return [ray.util.get_node_ip_address()] * routers
    nodes = ray.util.placement_group_table(placement_group)["bundles_to_node_id"]
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    return [ips.get(nodes.get(i)) for i in range(routers)]

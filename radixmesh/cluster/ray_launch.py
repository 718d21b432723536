"""Ray mode of `radixmesh launch`: every worker and the router run as Ray actors.

`radixmesh launch --ray` starts a local Ray instance; `--ray-address ADDR` (e.g. `auto`
on a node of a running cluster) joins one. Ray is imported here, lazily, and nowhere
else: the local launcher, the engine and the router run without it.

Decisions:

- **A worker actor owns a `radixmesh worker` subprocess** instead of serving gRPC in the
  actor's own process. The worker server drains on SIGTERM through signal handlers, which
  only the main thread of a process may install; tensor-parallel ranks are started by the
  worker process itself; and a subprocess runs exactly the code and flags of
  `radixmesh worker`, so the Ray mode cannot drift from the local one. The two lives are
  tied both ways: the child gets `PR_SET_PDEATHSIG` (SIGKILL), so it dies with the actor
  even when the actor is SIGKILLed (and a restarted actor never finds its old child
  holding the GPU), and a watcher thread ends the actor process when the child dies, so
  Ray restarts the actor (`max_restarts`, -1: forever) and with it the worker.
- **Each (re)start picks a free port on its node**, and the router is given a resolver
  per worker that asks the actor where it is now (`actor.address.remote()`). A fixed
  port per worker would break when Ray restarts the actor on another node or the port
  was taken meanwhile; a resolver follows the actor anywhere. The router itself stays
  free of Ray: it receives addresses and plain `async () -> str | None` callables
  (`radixmesh.router.pool.Resolver`). The restarted worker has a new cache-event epoch,
  so the router's summary for it resyncs from a snapshot (pool.py's event loop).
  The worker's Prometheus port is picked the same way (`actor.metrics_address.remote()`
  says where it is now; the driver prints them when the cluster is ready), unless
  `worker_metrics_port` fixes one port for every worker: that is for one worker per node
  (KubeRay's GPU pods, scraped through a headless Service on that port); two workers on
  one node would collide on it.
- **A worker whose restarts are used up** (a finite `max_restarts`) stays in the router,
  which sees it unhealthy for good and routes to the others. The driver logs an error
  naming it and keeps serving with the rest; when no worker is left it stops the cluster
  and `launch` returns 1.
- **Workers always require a key**: the router option `worker_api_key`, or one generated
  at start; each worker actor puts it in its subprocess's environment (never on its
  command line) and the router sends it on every worker call.
- **The router is an actor too** (restartable, on a fixed port of the driver's node, so
  that a Kubernetes Service on the Ray head finds it): it runs the router's
  `serve()` on an event loop of its own thread, with a stop event instead of signal
  handlers. The driver only starts actors, waits for health, and stops everything on
  SIGINT / SIGTERM.
- **Tensor parallelism**: a worker with `tp_size` > 1 gets a placement group of
  `tp_size` bundles (one GPU each on CUDA, one CPU each otherwise). The worker actor
  holds bundle 0 and one small reservation actor holds each other bundle; the worker's
  subprocess sees all of the group's GPUs (CUDA_VISIBLE_DEVICES) and runs its ranks on
  them. The default strategy is STRICT_PACK, because the ranks are local processes of
  one worker and cannot use another node's GPUs; PACK is accepted too.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radixmesh.cluster.launch import free_port, supervise, wait_router_ready
from radixmesh.cluster.spec import LaunchSpec, RayOptions
from radixmesh.errors import InvalidArgument, Unimplemented

_PR_SET_PDEATHSIG = 1
_ANY_HOST = ("0.0.0.0", "::", "")


def rank_resources(use_gpu: bool, cpus_per_rank: float) -> dict[str, float]:
    """What one tensor-parallel rank asks Ray for (as actor options)."""
    return {"num_gpus": 1.0, "num_cpus": cpus_per_rank} if use_gpu else {"num_cpus": cpus_per_rank}


def bundles(tp_size: int, use_gpu: bool, cpus_per_rank: float) -> list[dict[str, float]]:
    """The placement group of one worker: a bundle per tensor-parallel rank."""
    bundle = {"GPU": 1.0, "CPU": cpus_per_rank} if use_gpu else {"CPU": cpus_per_rank}
    return [{k: v for k, v in bundle.items() if v} for _ in range(tp_size)]


def advertised_host(bind_host: str, node_ip: str) -> str:
    """The address others reach a server at: the node's IP when it binds every interface."""
    return node_ip if bind_host in _ANY_HOST else bind_host


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the process that started it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "radixmesh.cluster.cli", *args]


# ---- actors (plain classes; `ray.remote` wraps them in `RayCluster.start`) ----------------


class WorkerActor:
    """One worker: a `radixmesh worker` subprocess on a free port of this node, with its
    /metrics on another free port (or on `metrics_port`, when given)."""

    def __init__(
        self,
        model: str,
        host: str,
        worker_args: tuple[str, ...],
        stop_timeout: float,
        gpu_peers: list[Any] | None = None,
        metrics_port: int | None = None,
        api_key: str | None = None,
    ) -> None:
        import ray

        from radixmesh.cluster.env import API_KEY_ENV

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

    def address(self) -> str:
        return self._address

    def metrics_address(self) -> str:
        """host:port of this worker's Prometheus /metrics, as of its latest (re)start."""
        return self._metrics_address

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
    """Holds one bundle of a worker's placement group and says which GPUs Ray gave it."""

    def gpu_ids(self) -> list[int | str]:
        import ray

        return list(ray.get_gpu_ids())


class RouterActor:
    """The router's `serve()` on an event loop in a thread of this actor."""

    def __init__(self, config: LaunchSpec, workers: list[Any]) -> None:
        import ray

        from radixmesh.router.pool import WorkerPool
        from radixmesh.router.server import serve

        addresses = tuple(ray.get([w.address.remote() for w in workers]))
        router_config = config.router_config(addresses)
        host = advertised_host(config.host, ray.util.get_node_ip_address())
        self._address = f"{host}:{config.port}"
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        timeout = (config.ray or RayOptions()).resolve_timeout
        resolvers = [self._resolver(w, timeout) for w in workers]
        created = threading.Event()

        async def main() -> None:
            # gRPC aio channels belong to the loop they are made on: make the pool here.
            self.pool = WorkerPool(router_config, resolvers)
            created.set()
            await serve(router_config, pool=self.pool, stop=self._stop)

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(main())

        self._thread = threading.Thread(target=run, name="router", daemon=True)
        self._thread.start()
        created.wait()

    @staticmethod
    def _resolver(worker: Any, timeout: float) -> Callable[[], Any]:
        async def resolve() -> str | None:
            return str(await asyncio.wait_for(worker.address.remote(), timeout))

        return resolve

    def address(self) -> str:
        return self._address

    def summaries(self) -> dict[str, dict[str, Any]]:
        """Per worker: the address the router uses and the state of its prefix summary."""

        async def read() -> dict[str, dict[str, Any]]:
            return {
                wid: {
                    "address": w.address,
                    "healthy": w.healthy,
                    "epoch": w.summary.epoch,
                    "sequence": w.summary.sequence,
                    "resyncs": w.resyncs,
                    "cached_blocks": w.summary.num_confirmed,
                }
                for wid, w in self.pool.workers.items()
            }

        return asyncio.run_coroutine_threadsafe(read(), self._loop).result(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)


# ---- the driver ---------------------------------------------------------------------------


class RayCluster:
    """The actors of one Ray-mode cluster. Use as a context manager, or start() / stop()."""

    def __init__(self, config: LaunchSpec) -> None:
        self.config = config
        self.options = config.ray or RayOptions()
        self.workers: list[Any] = []  # WorkerActor handles
        self.reservations: list[Any] = []
        self.placement_groups: list[Any] = []
        self.router: Any = None
        self.address = ""
        self._owns_ray = False
        self._dead: set[str] = set()  # workers dead for good, already logged

    def _use_gpu(self) -> bool:
        import ray

        if self.config.device != "auto":
            return self.config.device == "cuda"
        return ray.cluster_resources().get("GPU", 0) > 0

    def start(self) -> None:
        try:
            import ray
        except ImportError as e:
            raise Unimplemented(
                "ray_address", "Ray mode needs Ray: pip install 'radixmesh[ray]'"
            ) from e

        c, o = self.config, self.options
        if not c.worker_api_key:  # workers always require a key
            self.config = c = dataclasses.replace(c, worker_api_key=secrets.token_urlsafe(32))
        if not ray.is_initialized():
            ray.init(address=o.address, include_dashboard=False)
            self._owns_ray = True
        use_gpu = self._use_gpu()
        worker_args = c.worker_args
        if c.tp_size > 1:
            worker_args = (*worker_args, "--tp-size", str(c.tp_size))
        for _ in range(c.workers):
            self.workers.append(self._start_worker(ray, use_gpu, worker_args))
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # The router stays on the driver's node, where a Service (or the user) finds it.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        router_cls = ray.remote(RouterActor).options(
            num_cpus=o.router_cpus, max_restarts=o.max_restarts, scheduling_strategy=here
        )
        self.router = router_cls.remote(c, self.workers)
        self.address = str(ray.get(self.router.address.remote()))

    def _start_worker(self, ray: Any, use_gpu: bool, worker_args: tuple[str, ...]) -> Any:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        c, o = self.config, self.options
        key = c.worker_api_key
        rank = rank_resources(use_gpu, o.cpus_per_worker)
        if c.tp_size == 1:
            actor = ray.remote(WorkerActor).options(max_restarts=o.max_restarts, **rank)
            return actor.remote(
                c.model, c.host, worker_args, c.stop_timeout, None, o.worker_metrics_port, key
            )
        if not use_gpu and o.cpus_per_worker <= 0:
            raise InvalidArgument(
                "cpus_per_worker", "must be > 0 for a CPU tensor-parallel worker (its bundles)"
            )
        pg = placement_group(
            bundles(c.tp_size, use_gpu, o.cpus_per_worker), strategy=o.placement_strategy
        )
        self.placement_groups.append(pg)

        def in_bundle(i: int) -> PlacementGroupSchedulingStrategy:
            return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)

        peers = [
            ray.remote(GpuReservation)
            .options(max_restarts=-1, scheduling_strategy=in_bundle(i), **rank)
            .remote()
            for i in range(1, c.tp_size)
        ]
        self.reservations.extend(peers)
        gpu_peers = peers if use_gpu else None  # GpuReservation handles
        actor = ray.remote(WorkerActor).options(
            max_restarts=o.max_restarts, scheduling_strategy=in_bundle(0), **rank
        )
        return actor.remote(
            c.model, c.host, worker_args, c.stop_timeout, gpu_peers, o.worker_metrics_port, key
        )

    def worker_addresses(self) -> list[str]:
        import ray

        return [str(a) for a in ray.get([w.address.remote() for w in self.workers])]

    def worker_metrics_addresses(self) -> list[str]:
        import ray

        return [str(a) for a in ray.get([w.metrics_address.remote() for w in self.workers])]

    def dead_workers(self) -> list[str]:
        """The ids (worker-i, as the router names them) of the worker actors that are dead
        for good: their restarts used up, or killed without restart."""
        import ray

        refs = [w.address.remote() for w in self.workers]
        dead = []
        for i, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=5)
            except ray.exceptions.RayActorError:
                dead.append(f"worker-{i}")
            except ray.exceptions.GetTimeoutError:
                pass  # restarting
        return dead

    def router_gone(self) -> str | None:
        """A message when the router actor is dead for good (its restarts used up)."""
        import ray

        try:
            ray.get(self.router.address.remote(), timeout=5)
        except ray.exceptions.RayActorError as e:
            return f"the router actor ({type(e).__name__})"
        except ray.exceptions.GetTimeoutError:
            return None  # restarting
        return None

    def wait_ready(self, stop_requested: Callable[[], bool] = lambda: False) -> bool:
        keys = self.config.admin_keys or self.config.api_keys
        cert = self.config.tls_cert
        root = Path(cert).read_bytes() if cert else None
        return wait_router_ready(
            self.address,
            self.config.ready_timeout,
            stop_requested=stop_requested,
            api_key=keys[0] if keys else None,
            root_certificates=root,
        )

    def stop(self) -> None:
        if not (self._owns_ray or self.workers or self.reservations or self.router):
            return  # nothing started (e.g. no Ray installed)
        import ray

        timeout = self.config.stop_timeout
        calls = [self.router.stop.remote(timeout)] if self.router is not None else []
        calls += [w.stop.remote() for w in self.workers]
        with contextlib.suppress(ray.exceptions.RayError):
            ray.get(calls, timeout=timeout + 5)
        for actor in [self.router, *self.workers, *self.reservations]:
            if actor is not None:
                with contextlib.suppress(ray.exceptions.RayError):
                    ray.kill(actor, no_restart=True)
        for pg in self.placement_groups:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.util.remove_placement_group(pg)
        if self._owns_ray:
            ray.shutdown()

    def ready_line(self) -> str:
        return (
            f"radixmesh cluster ready (ray): router {self.address}, "
            f"workers {', '.join(self.worker_addresses())}, "
            f"worker metrics {', '.join(self.worker_metrics_addresses())}"
        )

    def failure(self) -> str | None:
        """Why the cluster must stop: the router is dead for good, or every worker is.
        A worker dead for good (its finite max_restarts used up) is logged once."""
        if (gone := self.router_gone()) is not None:
            return f"{gone} is dead"
        for wid in self.dead_workers():
            if wid not in self._dead:
                self._dead.add(wid)
                left = len(self.workers) - len(self._dead)
                print(
                    f"radixmesh: error: {wid} is dead for good (max_restarts "
                    f"{self.options.max_restarts} used up); {left} worker(s) left",
                    file=sys.stderr,
                    flush=True,
                )
        if self.workers and len(self._dead) == len(self.workers):
            return "no worker left"
        return None

    def __enter__(self) -> RayCluster:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch(config: LaunchSpec) -> int:
    """Run a Ray-mode cluster until SIGINT / SIGTERM, the router's final death, or every
    worker's (see `RayCluster.failure`)."""
    return supervise(RayCluster(config), check_every=5.0)

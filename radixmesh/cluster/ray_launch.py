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
- **A worker whose restarts are used up** (a finite `max_restarts`) stays in the routers,
  which see it unhealthy for good and route to the others. The driver logs an error
  naming it and keeps serving with the rest (so for a router: the others serve on); when
  no worker, or no router, is left it stops the cluster and `launch` returns 1.
- **Workers always require a key**: the router option `worker_api_key`, or one generated
  at start; each worker actor puts it in its subprocess's environment (never on its
  command line) and the router sends it on every worker call.
- **Each router is an actor too** (`LaunchSpec.routers` of them, each restartable): it
  runs the router's `serve()` on an event loop of its own thread, with a stop event
  instead of signal handlers, and gets every worker's resolver, so each follows every
  worker's cache events and holds the same exact summaries. All serve the same fixed
  port (and HTTP port) on their nodes: routers on one machine share them through
  SO_REUSEPORT and the kernel spreads connections over them. The Prometheus port cannot
  be shared, so a router's is the configured one plus the number of routers before it on
  its machine (`host_rank`). Placement (`router_placement`): "driver" keeps them on the
  driver's node, so that a Kubernetes Service on the Ray head finds them; "spread" puts
  one per node with a STRICT_SPREAD placement group (Ray, or its autoscaler, finds the
  nodes; a bundle whose node dies is placed again on another). The cluster serves on
  while one router is left. The driver only starts actors, waits for every router to be
  ready, and stops everything on SIGINT / SIGTERM.
- **Tensor parallelism**: the worker actor holds rank 0 and one small reservation actor
  holds each other rank's resources; the worker's subprocess sees all of their GPUs
  (CUDA_VISIBLE_DEVICES) and runs its ranks on them. With `worker_placement` "any" a
  worker with `tp_size` > 1 gets a placement group of `tp_size` bundles (one GPU each on
  CUDA, one CPU each otherwise), STRICT_PACK by default because the ranks are local
  processes of one worker and cannot use another node's GPUs (PACK is accepted too).
- **Workers across nodes** (`worker_placement` "spread", ray_placement.py): one SPREAD
  placement group, a bundle per worker holding all its ranks, so a worker's ranks share
  a node and the workers spread evenly. **A lost node's workers come back through Ray**,
  not the launcher: Ray places the lost bundles again on the surviving nodes and
  restarts the actors in them under the same handles, so the routers' resolvers find
  them, worker ids stay, and nothing depends on the driver being alive at that moment
  (ray_placement.py gives the whole reasoning). Meanwhile the routers retry the lost
  workers' requests elsewhere (router/dispatch.py) and, once the workers moved, replace
  their summaries from the new processes' snapshots.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radixmesh.cluster.launch import supervise, wait_router_ready
from radixmesh.cluster.ray_actors import GpuReservation, RouterActor, WorkerActor
from radixmesh.cluster.ray_placement import (
    WorkerPlace,
    WorkerPlacement,
    placement_lines,
    rank_resources,
)
from radixmesh.cluster.spec import LaunchSpec, RayOptions
from radixmesh.errors import Unavailable, Unimplemented


class RayCluster:
    """The actors of one Ray-mode cluster. Use as a context manager, or start() / stop()."""

    def __init__(self, config: LaunchSpec) -> None:
        self.config = config
        self.options = config.ray or RayOptions()
        self.workers: list[Any] = []  # WorkerActor handles
        self.reservations: list[Any] = []
        self.placement_groups: list[Any] = []
        self.routers: list[Any] = []  # RouterActor handles, router-i at index i
        self.addresses: list[str] = []  # each router's, once ready
        self._router_group: Any = None  # the routers' placement group ("spread")
        self._placement: WorkerPlacement | None = None  # the workers' groups
        self._owns_ray = False
        self._dead: set[str] = set()  # workers and routers dead for good, already logged

    @property
    def router(self) -> Any:
        """The first router actor (None before start)."""
        return self.routers[0] if self.routers else None

    @property
    def address(self) -> str:
        """Where clients reach a router (the first one's address; on one node, every
        router's: they share the port)."""
        return self.addresses[0] if self.addresses else ""

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
            if o.ray_address is None:
                # A Ray started here: its worker processes (these actors) at the default
                # priority, not Ray's nice 15, under which any other load on the machine
                # starves them (a cluster ready in 20 s was not in 300 beside two busy
                # loops). A cluster started elsewhere sets it on its nodes (deploy/ray/).
                os.environ.setdefault("RAY_worker_niceness", "0")
            # The dashboard: only a Ray started here takes this (a joined one has its own).
            ray.init(address=o.ray_address, include_dashboard=o.ray_dashboard)
            self._owns_ray = True
        use_gpu = self._use_gpu()
        worker_args = c.worker_args
        if c.tp_size > 1:
            worker_args = (*worker_args, "--tp-size", str(c.tp_size))
        self._placement = WorkerPlacement(
            o.worker_placement, c.workers, c.tp_size, use_gpu, o.cpus_per_worker,
            o.placement_strategy,
        )  # fmt: skip
        self.placement_groups.extend(self._placement.groups)
        for i in range(c.workers):
            self.workers.append(self._start_worker(ray, i, use_gpu, worker_args))
        self._start_routers(ray)

    def _start_routers(self, ray: Any) -> None:
        """`routers` router actors, each given every worker's handle (its resolver) and
        placed by `router_placement`. Not waited for here: a spread group may wait for
        nodes (wait_ready says so when it times out)."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import (
            NodeAffinitySchedulingStrategy,
            PlacementGroupSchedulingStrategy,
        )

        c, o = self.config, self.options
        pg = None
        if o.router_placement == "spread":
            pg = placement_group([{"CPU": o.router_cpus}] * c.routers, strategy="STRICT_SPREAD")
            self.placement_groups.append(pg)
            self._router_group = pg
            strategies: list[Any] = [
                PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
                for i in range(c.routers)
            ]
        else:  # on the driver's node, where a Service (or the user) finds them
            node = ray.get_runtime_context().get_node_id()
            strategies = [NodeAffinitySchedulingStrategy(node, soft=False)] * c.routers
        for i, strategy in enumerate(strategies):
            actor = ray.remote(RouterActor).options(
                num_cpus=o.router_cpus,
                max_restarts=o.ray_max_restarts,
                scheduling_strategy=strategy,
            )
            self.routers.append(actor.remote(c, self.workers, i, pg))

    def _start_worker(
        self, ray: Any, index: int, use_gpu: bool, worker_args: tuple[str, ...]
    ) -> Any:
        """Worker `index`: its actor (rank 0) and a reservation per other rank, each where
        the workers' placement puts it (ray_placement.py)."""
        c, o = self.config, self.options
        placement = self._placement
        assert placement is not None
        rank = rank_resources(use_gpu, o.cpus_per_worker)

        def where(r: int) -> dict[str, Any]:
            strategy = placement.strategy(index, r)
            return {} if strategy is None else {"scheduling_strategy": strategy}

        reservation = ray.remote(GpuReservation)
        peers = [
            reservation.options(max_restarts=-1, **where(r), **rank).remote(
                f"worker-{index} rank {r}"
            )
            for r in range(1, c.tp_size)
        ]
        self.reservations.extend(peers)
        gpu_peers = peers if use_gpu else None  # GpuReservation handles
        actor = ray.remote(WorkerActor).options(max_restarts=o.ray_max_restarts, **where(0), **rank)
        return actor.remote(
            c.model, c.host, worker_args, c.stop_timeout, gpu_peers, o.worker_metrics_port,
            c.worker_api_key, f"worker-{index}",
        )  # fmt: skip

    def worker_addresses(self) -> list[str]:
        import ray

        return [str(a) for a in ray.get([w.address.remote() for w in self.workers])]

    def worker_nodes(self) -> list[str]:
        """The Ray node id each worker actor runs on now (as the actor itself says)."""
        import ray

        return [str(n) for n in ray.get([w.node_id.remote() for w in self.workers])]

    def worker_bundle_nodes(self) -> list[str] | None:
        """The node id of each worker's bundle in the placement group table (spread
        placement; None otherwise; "" for a bundle waiting for room)."""
        return None if self._placement is None else self._placement.bundle_nodes()

    def placement(self) -> list[WorkerPlace]:
        """Where each worker landed now: its actor, node and ranks' nodes, and its group's
        bundle, with the ids Ray's state API and dashboard list (ray_placement.py)."""
        import ray

        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        ids = ray.get([w.actor_id.remote() for w in self.workers])
        nodes = self.worker_nodes()
        rank_nodes = ray.get([r.node_id.remote() for r in self.reservations])
        peers = self.config.tp_size - 1  # reservations per worker, in worker order
        tables: dict[str, dict[str, Any]] = {}
        places = []
        for i, (actor_id, node) in enumerate(zip(ids, nodes, strict=True)):
            ranks = tuple(str(n) for n in rank_nodes[i * peers : (i + 1) * peers])
            place = WorkerPlace(f"worker-{i}", str(actor_id), node, str(ips.get(node, "")), ranks)
            group = None if self._placement is None else self._placement.group_of(i)
            if group is not None:
                pg, bundle = group
                pg_id = pg.id.hex()
                if pg_id not in tables:
                    tables[pg_id] = ray.util.placement_group_table(pg)
                strategy = str(tables[pg_id]["strategy"])
                place = dataclasses.replace(
                    place, placement_group=pg_id, bundle=bundle, strategy=strategy
                )
            places.append(place)
        return places

    def worker_metrics_addresses(self) -> list[str]:
        import ray

        return [str(a) for a in ray.get([w.metrics_address.remote() for w in self.workers])]

    def router_metrics_addresses(self) -> list[str]:
        """host:port of each router's /metrics (none when `metrics_port` is unset)."""
        import ray

        found = ray.get([r.metrics_address.remote() for r in self.routers])
        return [str(a) for a in found if a is not None]

    def dead_workers(self) -> list[str]:
        """The ids (worker-i, as the router names them) of the worker actors that are dead
        for good: their restarts used up, or killed without restart."""
        return [f"worker-{i}" for i in _dead_for_good(self.workers)]

    def dead_routers(self) -> list[str]:
        """The router actors (router-i) that are dead for good."""
        return [f"router-{i}" for i in _dead_for_good(self.routers)]

    def wait_ready(self, stop_requested: Callable[[], bool] = lambda: False) -> bool:
        """Block until every router serves and sees every worker healthy (True), or until
        `stop_requested()` (False); Unavailable if a router dies or time runs out."""
        deadline = time.monotonic() + self.config.ready_timeout
        if not self._wait_routers_ready(deadline, stop_requested):
            return False
        import ray

        self.addresses = [str(a) for a in ray.get([r.address.remote() for r in self.routers])]
        # And through the network, as a client would (API key, TLS): routers on one node
        # share the port, so this reaches one of them.
        keys = self.config.admin_keys or self.config.api_keys
        cert = self.config.tls_cert
        root = Path(cert).read_bytes() if cert else None
        return wait_router_ready(
            self.address,
            max(deadline - time.monotonic(), 1.0),
            stop_requested=stop_requested,
            api_key=keys[0] if keys else None,
            root_certificates=root,
        )

    def _wait_routers_ready(self, deadline: float, stop_requested: Callable[[], bool]) -> bool:
        """Poll each router actor's `ready()`, one call in flight per router (an actor
        still waiting for its node queues calls, so they are not sent again and again)."""
        import ray

        calls = {i: r.ready.remote() for i, r in enumerate(self.routers)}
        while calls:
            if stop_requested():
                return False
            if time.monotonic() > deadline:
                raise Unavailable(self._not_ready(sorted(calls)))
            done, _ = ray.wait(list(calls.values()), num_returns=len(calls), timeout=0.2)
            for i, ref in list(calls.items()):
                if ref not in done:
                    continue
                try:
                    ok = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    # Its process died: Ray restarts it, unless its restarts are used up.
                    if _dead_for_good([self.routers[i]]):
                        raise Unavailable(f"router-{i} died during startup: {e}") from e
                    ok = False
                except ray.exceptions.RayError as e:  # its serve() ended (e.g. a port taken)
                    cause = getattr(e, "cause", None) or e  # the actor's own error
                    raise Unavailable(f"router-{i} failed during startup: {cause}") from e
                if ok:
                    del calls[i]
                else:
                    calls[i] = self.routers[i].ready.remote()
            time.sleep(0.2)
        return True

    def _not_ready(self, routers: list[int]) -> str:
        import ray

        names = ", ".join(f"router-{i}" for i in routers)
        why = f"{names} not ready within {self.config.ready_timeout}s"
        pg = self._router_group
        if pg is not None and ray.util.placement_group_table(pg)["state"] != "CREATED":
            alive = sum(1 for n in ray.nodes() if n["Alive"])
            why += (
                f": router_placement 'spread' puts one router per node and needs "
                f"{self.config.routers} nodes with {self.options.router_cpus} CPU free; "
                f"the cluster has {alive}"
            )
        return why

    def stop(self) -> None:
        if not (self._owns_ray or self.workers or self.reservations or self.routers):
            return  # nothing started (e.g. no Ray installed)
        import ray

        timeout = self.config.stop_timeout
        calls = [r.stop.remote(timeout) for r in self.routers]
        calls += [w.stop.remote() for w in self.workers]
        # Every stop ends (or fails: a dead actor) before the kills; a get would end at
        # the first failure.
        if calls:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.wait(calls, num_returns=len(calls), timeout=timeout + 5)
        for actor in [*self.routers, *self.workers, *self.reservations]:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.kill(actor, no_restart=True)
        for pg in self.placement_groups:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.util.remove_placement_group(pg)
        if self._owns_ray:
            ray.shutdown()

    def ready_line(self) -> str:
        """The ready line (routers, workers, their metrics), then a line per worker saying
        where it landed."""
        routers = f"router {self.address}"
        if len(self.addresses) > 1:
            routers = f"routers {', '.join(self.addresses)}"
        if metrics := self.router_metrics_addresses():
            routers += f" (metrics {', '.join(metrics)})"
        ready = (
            f"radixmesh cluster ready (ray): {routers}, "
            f"workers {', '.join(self.worker_addresses())}, "
            f"worker metrics {', '.join(self.worker_metrics_addresses())}"
        )
        # Then where each worker landed, one line each (ray_placement.placement_lines).
        return "\n".join([ready, *placement_lines(self.placement())])

    def failure(self) -> str | None:
        """Why the cluster must stop: every router is dead for good, or every worker is.
        A worker or router dead for good (its finite max_restarts used up) is logged once;
        the others serve on."""
        self._log_dead(self.dead_routers(), "router", len(self.routers))
        self._log_dead(self.dead_workers(), "worker", len(self.workers))
        if self.routers and all(f"router-{i}" in self._dead for i in range(len(self.routers))):
            return "no router left"
        if self.workers and all(f"worker-{i}" in self._dead for i in range(len(self.workers))):
            return "no worker left"
        return None

    def _log_dead(self, dead: list[str], kind: str, total: int) -> None:
        for name in dead:
            if name not in self._dead:
                self._dead.add(name)
                left = total - sum(1 for d in self._dead if d.startswith(f"{kind}-"))
                print(
                    f"radixmesh: error: {name} is dead for good (max_restarts "
                    f"{self.options.ray_max_restarts} used up); {left} {kind}(s) left",
                    file=sys.stderr,
                    flush=True,
                )

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


def _dead_for_good(actors: list[Any]) -> list[int]:
    """The indexes of the actors that are dead for good: restarts used up, or killed
    without restart (an actor restarting does not answer in time and is not counted)."""
    import ray

    refs = [a.address.remote() for a in actors]
    dead = []
    for i, ref in enumerate(refs):
        try:
            ray.get(ref, timeout=5)
        except ray.exceptions.ActorUnavailableError:
            pass  # restarting (a RayActorError too, so caught before it)
        except ray.exceptions.RayActorError:
            dead.append(i)
        except ray.exceptions.GetTimeoutError:
            pass  # restarting
    return dead


def launch(config: LaunchSpec) -> int:
    """Run a Ray-mode cluster until SIGINT / SIGTERM, or until every router or every
    worker is dead for good (see `RayCluster.failure`)."""
    return supervise(RayCluster(config), check_every=5.0)

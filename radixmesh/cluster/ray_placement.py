"""Where Ray mode puts each worker's actors (`RayOptions.worker_placement`).

A worker is one actor for its rank 0 and a `GpuReservation` actor for each other
tensor-parallel rank; all of them must share a node (the ranks are local processes of the
worker). Two placements:

- **any** (the default): Ray's scheduler places a one-rank worker wherever it fits;
  a worker of `tp_size` > 1 gets a placement group of its own, one bundle per rank
  (`placement_strategy`: STRICT_PACK keeps the ranks on one node). Where the workers
  land relative to each other is Ray's choice: its default policy packs them on the
  first nodes with room.
- **spread**: one placement group for all workers, strategy SPREAD, one bundle per
  worker holding all its ranks' resources (`tp_size` GPUs and `tp_size *
  cpus_per_worker` CPUs). A bundle never spans nodes, so a worker's ranks share one; SPREAD
  puts the bundles on as many nodes as it can, evenly, so losing a node loses the fewest
  workers. The worker actor and its reservations all go in the worker's bundle.

**A node lost**: the bundles that were on it are rescheduled by Ray itself (the group
goes to RESCHEDULING, then CREATED when the surviving nodes have room), and the worker
actors, restartable (`ray_max_restarts`), are restarted inside their bundle wherever it
lands. The launcher does not re-create anything, for three reasons: Ray keeps the
actor handles valid across restarts, so every router's resolver (`actor.address`) finds
the restarted worker without being told; the worker ids (`worker-i`) stay the same, so
the routers' summaries and metrics keep their names; and a launcher that re-created
actors would have to be alive and watching, while Ray's GCS restarts them even when the
driver is busy or restarting. When the surviving nodes have no room, the bundle waits
(the cluster shrinks: the routers see those workers down and route to the others) and
is placed when a node joins.

**Seeing it**: `RayCluster.placement()` says where each worker landed (a `WorkerPlace`:
its actor, node, ranks' nodes, group and bundle), with the ids Ray's state API and
dashboard use (`ray list actors --detail`, `ray list placement-groups --detail`); the
launcher prints it under its ready line (`placement_lines`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixmesh.errors import InvalidArgument


def rank_resources(use_gpu: bool, cpus_per_rank: float) -> dict[str, float]:
    """What one tensor-parallel rank asks Ray for (as actor options)."""
    return {"num_gpus": 1.0, "num_cpus": cpus_per_rank} if use_gpu else {"num_cpus": cpus_per_rank}


def bundles(tp_size: int, use_gpu: bool, cpus_per_rank: float) -> list[dict[str, float]]:
    """The placement group of one worker: a bundle per tensor-parallel rank."""
    bundle = {"GPU": 1.0, "CPU": cpus_per_rank} if use_gpu else {"CPU": cpus_per_rank}
    return [{k: v for k, v in bundle.items() if v} for _ in range(tp_size)]


def worker_bundle(tp_size: int, use_gpu: bool, cpus_per_rank: float) -> dict[str, float]:
    """One bundle holding all of a worker's ranks (the spread placement)."""
    bundle = {"GPU": float(tp_size) if use_gpu else 0.0, "CPU": tp_size * cpus_per_rank}
    return {k: v for k, v in bundle.items() if v}


@dataclass(frozen=True)
class WorkerPlace:
    """Where one worker landed, named as Ray's state API and dashboard name it."""

    worker: str
    """worker-i, as the routers name it (and the actor's repr name in Ray's state API)."""
    actor_id: str
    """The worker actor's (rank 0's) Ray actor id."""
    node_id: str
    """The Ray node the actor runs on."""
    node_ip: str
    """That node's address ("" when Ray no longer lists the node)."""
    rank_nodes: tuple[str, ...] = ()
    """The node of each other tensor-parallel rank's reservation (ranks 1, 2, ...)."""
    placement_group: str | None = None
    """The id of the placement group the actor sits in (None: Ray's scheduler placed it)."""
    bundle: int | None = None
    """The actor's bundle in that group (spread: worker i's is bundle i)."""
    strategy: str | None = None
    """That group's strategy (SPREAD, STRICT_PACK, PACK)."""


def placement_lines(places: list[WorkerPlace]) -> list[str]:
    """One line per worker, for an operator to find its rows in `ray list actors --detail`
    and the dashboard (by actor id, node id or repr name)."""
    lines = []
    for p in places:
        line = f"radixmesh placement (ray): {p.worker} actor {p.actor_id} on node {p.node_id}"
        line += f" ({p.node_ip})" if p.node_ip else ""
        if p.rank_nodes:
            ranks = f"ranks 1-{len(p.rank_nodes)}" if len(p.rank_nodes) > 1 else "rank 1"
            if all(n == p.node_id for n in p.rank_nodes):
                line += f", {ranks} on the same node"
            else:  # only while a reservation's actor restarts elsewhere
                line += f", {ranks} on nodes {', '.join(p.rank_nodes)}"
        if p.placement_group is not None:
            line += f", bundle {p.bundle} of placement group {p.placement_group} ({p.strategy})"
        lines.append(line)
    return lines


class WorkerPlacement:
    """The placement groups of a cluster's workers, and where each rank's actor goes.

    Made once per cluster (it creates the groups: a Ray session must be up); `strategy`
    is then asked for each actor. `groups` lists what was created, for removal at stop.
    """

    def __init__(
        self,
        placement: str,
        workers: int,
        tp_size: int,
        use_gpu: bool,
        cpus_per_rank: float,
        tp_strategy: str = "STRICT_PACK",
    ) -> None:
        from ray.util.placement_group import placement_group

        if (placement == "spread" or tp_size > 1) and not use_gpu and cpus_per_rank <= 0:
            why = "spread placement" if placement == "spread" else "tensor-parallel worker"
            raise InvalidArgument("cpus_per_worker", f"must be > 0 for a CPU {why} (its bundles)")
        self.placement = placement
        self.workers = workers
        self.groups: list[Any] = []
        self._per_worker: list[Any] = []  # "any" with tp_size > 1: one group per worker
        self._spread: Any = None
        if placement == "spread":
            bundle = worker_bundle(tp_size, use_gpu, cpus_per_rank)
            self._spread = placement_group([bundle] * workers, strategy="SPREAD")
            self.groups.append(self._spread)
        elif tp_size > 1:
            for _ in range(workers):
                pg = placement_group(bundles(tp_size, use_gpu, cpus_per_rank), strategy=tp_strategy)
                self._per_worker.append(pg)
                self.groups.append(pg)

    def strategy(self, worker: int, rank: int) -> Any:
        """The scheduling strategy of worker `worker`'s rank `rank` actor (None: Ray's
        default scheduler)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self._spread is not None:
            return PlacementGroupSchedulingStrategy(
                self._spread, placement_group_bundle_index=worker
            )
        if self._per_worker:
            return PlacementGroupSchedulingStrategy(
                self._per_worker[worker], placement_group_bundle_index=rank
            )
        return None

    def group_of(self, worker: int) -> tuple[Any, int] | None:
        """The placement group of worker `worker`'s actor (rank 0) and its bundle index in
        it (None: placed by Ray's scheduler)."""
        if self._spread is not None:
            return self._spread, worker
        if self._per_worker:
            return self._per_worker[worker], 0
        return None

    def bundle_nodes(self) -> list[str] | None:
        """The node id of each worker's bundle (spread placement; None otherwise, or a
        worker whose bundle waits for room: its entry is empty)."""
        import ray

        if self._spread is None:
            return None
        nodes = ray.util.placement_group_table(self._spread)["bundles_to_node_id"]
        return [str(nodes.get(i, "")) for i in range(self.workers)]

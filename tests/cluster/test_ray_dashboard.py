"""Ray's own state API (the dashboard's backend) shows where the workers landed: two
spread tensor-parallel workers (dummy:tiny, tp_size 2) on two Ray nodes of this machine,
started with the dashboard as `ray start --head` starts it.

What the state API lists (`ray list actors --detail`, `ray list placement-groups
--detail`, the dashboard's Actors and Placement Groups pages) is checked against the
placement group and against what the launcher prints (`RayCluster.placement()`). The
state API has no placement group strategy: Ray's placement group table says it.

The dashboard costs ~1 s of start and ~200 MiB (PSS) on this kind of machine: its nine
head modules are forked processes, ~90 MiB RSS each, mostly shared (docs/deploy.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from radixmesh.cluster.launch import free_port
from radixmesh.cluster.ray_launch import RayCluster
from radixmesh.cluster.ray_placement import placement_lines
from radixmesh.cluster.spec import RayOptions
from tests.cluster.ray_nodes import ray_nodes
from tests.cluster.test_ray_node_loss import _spec


@pytest.fixture(scope="module")
def two_nodes(ray_turn: None) -> Iterator[Any]:
    with ray_nodes(2, num_cpus=2, include_dashboard=True, dashboard_port=free_port()) as nodes:
        yield nodes


@pytest.mark.slow
def test_the_state_api_shows_each_workers_node_and_its_bundle(two_nodes: Any) -> None:
    import ray
    from ray.util.state import list_actors, list_nodes, list_placement_groups

    # Two workers of two ranks, a CPU each: a bundle of 2 CPUs per worker, one per node.
    config = dataclasses.replace(
        _spec(), workers=2, tp_size=2, router_options={"seed": 0},
        ray=RayOptions(cpus_per_worker=1.0, worker_placement="spread"),
    )  # fmt: skip
    with RayCluster(config) as cluster:
        (pg,) = cluster.placement_groups
        pg_id = pg.id.hex()
        (group,) = list_placement_groups(
            filters=[("placement_group_id", "=", pg_id)], detail=True, raise_on_missing_output=True
        )
        assert group.state == "CREATED"
        # The state API (Ray 2.60) lists no strategy; Ray's table, and the launcher, say it.
        assert ray.util.placement_group_table(pg)["strategy"] == "SPREAD"
        by_index = {b["bundle_id"]["bundle_index"]: b for b in group.bundles or []}
        assert [by_index[i]["unit_resources"] for i in (0, 1)] == [{"CPU": 2.0}] * 2
        bundle_nodes = [by_index[i]["node_id"] for i in (0, 1)]
        alive = {n.node_id for n in list_nodes(filters=[("state", "=", "ALIVE")])}
        assert len(set(bundle_nodes)) == 2 and set(bundle_nodes) == alive

        # Every actor in the group: each worker (its repr name worker-i) in bundle i (its
        # resources are that bundle's: CPU_group_<i>_<group>) on that bundle's node, and
        # its rank 1 reservation in the same bundle.
        actors = list_actors(
            filters=[("placement_group_id", "=", pg_id)], detail=True, raise_on_missing_output=True
        )
        seen = {
            a.repr_name: (a.class_name, a.state, a.node_id, f"CPU_group_{i}_{pg_id}")
            for a in actors
            for i in range(2)
            if f"CPU_group_{i}_{pg_id}" in (a.required_resources or {})
        }
        expected = {}
        for i, node in enumerate(bundle_nodes):
            bundle = f"CPU_group_{i}_{pg_id}"
            expected[f"worker-{i}"] = ("WorkerActor", "ALIVE", node, bundle)
            expected[f"worker-{i} rank 1"] = ("GpuReservation", "ALIVE", node, bundle)
        assert len(actors) == 4 and seen == expected
        ids = {a.repr_name: a.actor_id for a in actors}

        # What the launcher prints under its ready line names the same actors, nodes and
        # bundles, and agrees with Ray's own placement group table.
        places = cluster.placement()
        assert [(p.worker, p.actor_id, p.node_id) for p in places] == [
            (f"worker-{i}", ids[f"worker-{i}"], bundle_nodes[i]) for i in (0, 1)
        ]
        assert [(p.placement_group, p.bundle, p.strategy) for p in places] == [
            (pg_id, i, "SPREAD") for i in (0, 1)
        ]
        assert [p.rank_nodes for p in places] == [(n,) for n in bundle_nodes]
        assert cluster.worker_bundle_nodes() == bundle_nodes
        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        assert [p.node_ip for p in places] == [ips[n] for n in bundle_nodes]
        ready = cluster.ready_line().splitlines()
        assert ready[0].startswith("radixmesh cluster ready (ray): ")
        assert ready[1:] == placement_lines(places)
        assert ready[1] == (
            f"radixmesh placement (ray): worker-0 actor {ids['worker-0']} on node "
            f"{bundle_nodes[0]} ({ips[bundle_nodes[0]]}), rank 1 on the same node, "
            f"bundle 0 of placement group {pg_id} (SPREAD)"
        )

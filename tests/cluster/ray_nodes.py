"""A Ray cluster of several raylets on this machine for the Ray tests (each takes it inside
conftest's `ray_turn`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def ray_nodes(raylets: int, num_cpus: int, **head_args: Any) -> Iterator[Any]:
    """A `ray.cluster_utils.Cluster` of `raylets` raylets (the head one of them) of
    `num_cpus` each, this process connected to it; the dashboard off unless `head_args`
    say otherwise. Take it inside `ray_turn`."""
    import ray
    from ray.cluster_utils import Cluster

    nodes = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": num_cpus, "include_dashboard": False, **head_args},
    )
    try:
        for _ in range(raylets - 1):
            nodes.add_node(num_cpus=num_cpus)
        nodes.wait_for_nodes()
        ray.init(address=nodes.address, log_to_driver=False)
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()

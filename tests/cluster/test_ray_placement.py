"""Ray mode's worker placement, before Ray places anything: the bundles each placement
asks for and the settings it refuses (ray_placement.py). Where the actors land on real
nodes is test_ray_node_loss.py's subject."""

from __future__ import annotations

import pytest

from radixmesh.cluster.cli import build_parser
from radixmesh.cluster.launch_flags import launch_spec
from radixmesh.cluster.ray_placement import WorkerPlacement, bundles, worker_bundle
from radixmesh.cluster.spec import LaunchSpec, RayOptions
from radixmesh.errors import InvalidArgument


def test_a_spread_bundle_holds_all_of_a_workers_ranks() -> None:
    assert worker_bundle(1, use_gpu=False, cpus_per_rank=0.5) == {"CPU": 0.5}
    assert worker_bundle(4, use_gpu=True, cpus_per_rank=1.0) == {"GPU": 4.0, "CPU": 4.0}
    assert worker_bundle(2, use_gpu=True, cpus_per_rank=0.0) == {"GPU": 2.0}
    # The "any" placement's group of a tensor-parallel worker: a bundle per rank.
    assert bundles(2, use_gpu=False, cpus_per_rank=0.5) == [{"CPU": 0.5}, {"CPU": 0.5}]


@pytest.mark.parametrize(
    ("placement", "tp_size", "why"),
    [("spread", 1, "CPU spread placement"), ("any", 2, "CPU tensor-parallel worker")],
)
def test_a_cpu_bundle_needs_cpus(placement: str, tp_size: int, why: str) -> None:
    """Ray refuses an empty bundle: the error names the field to set, before any group."""
    with pytest.raises(InvalidArgument) as err:
        WorkerPlacement(placement, 2, tp_size, use_gpu=False, cpus_per_rank=0.0)
    assert err.value.field == "cpus_per_worker"
    assert str(err.value) == f"cpus_per_worker: must be > 0 for a {why} (its bundles)"


def test_any_one_rank_workers_make_no_group() -> None:
    placement = WorkerPlacement("any", 3, 1, use_gpu=False, cpus_per_rank=0.0)
    assert placement.groups == []
    assert placement.strategy(0, 0) is None
    assert placement.bundle_nodes() is None


def test_worker_placement_is_checked_and_a_flag() -> None:
    with pytest.raises(
        InvalidArgument, match=r"^worker_placement: must be one of \('any', 'spread'\), got 'each'$"
    ):
        LaunchSpec(model="dummy:tiny", ray=RayOptions(worker_placement="each"))
    args = build_parser().parse_args(
        ["launch", "--model", "m", "--ray", "--worker-placement", "spread"]
    )
    spec = launch_spec(args, api_keys=(), admin_keys=(), worker_api_key=None)
    assert spec.ray is not None and spec.ray.worker_placement == "spread"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["launch", "--model", "m", "--worker-placement", "each"])

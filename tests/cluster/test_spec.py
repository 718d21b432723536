"""One launch spec for both backends: its checks, GPUs per worker, the router's options
as `radixmesh router` flags (parsed back by the real CLI)."""

from __future__ import annotations

import pytest

from radixmesh.cluster.cli import build_parser
from radixmesh.cluster.launch import worker_args
from radixmesh.cluster.spec import LaunchSpec, RayOptions
from radixmesh.errors import InvalidArgument


def test_the_spec_checks_its_fields() -> None:
    with pytest.raises(InvalidArgument, match="workers: must be >= 1, got 0"):
        LaunchSpec(model="m", workers=0)
    with pytest.raises(InvalidArgument, match="tp_size: must be >= 1, got 0"):
        LaunchSpec(model="m", tp_size=0)
    with pytest.raises(InvalidArgument, match="router_options: set 'api_keys' on the launch"):
        LaunchSpec(model="m", router_options={"api_keys": ("k",)})
    with pytest.raises(InvalidArgument, match="tls_cert: give both tls_cert and tls_key"):
        LaunchSpec(model="m", tls_cert="cert.pem")
    with pytest.raises(InvalidArgument, match="cpus_per_worker: must be >= 0, got -1"):
        RayOptions(cpus_per_worker=-1)
    # The workers' metrics port is the Ray backend's to set; locally it is a worker flag.
    assert LaunchSpec(model="m", worker_args=("--metrics-port=9091",)).ray is None


def test_gpus_per_worker_is_the_tp_size_on_cuda() -> None:
    assert LaunchSpec(model="m", tp_size=2, device="cuda").gpus_per_worker == 2
    assert LaunchSpec(model="m", tp_size=2, device="cpu", visible_gpus=8).gpus_per_worker == 0
    assert LaunchSpec(model="m", tp_size=2, visible_gpus=8).gpus_per_worker == 2
    assert LaunchSpec(model="m", tp_size=2, visible_gpus=0).gpus_per_worker == 0
    assert LaunchSpec(model="m").gpus_per_worker == 0
    spec = LaunchSpec(model="m", tp_size=2, device="cuda", worker_args=("--dtype", "float32"))
    assert worker_args(spec) == ("--dtype", "float32", "--tp-size", "2")


def test_router_options_become_the_router_commands_flags() -> None:
    options = {
        "http_port": 8000,
        "metrics_port": 9100,
        "seed": 0,
        "health_interval": 0.2,
        "health_timeout": 0.5,
        "breaker_failures": 1,
        "breaker_cooldown": 0.25,
        "tentative_ttl": 7.5,
        "summary_budget_bytes": 1 << 20,
        "program_max_queued": 0,
        "download_dir": "/hub",
        "tls_client_ca": None,
        "strict_openai": True,
        "separate_reasoning": False,
        "tool_call_parser": "hermes",
    }
    spec = LaunchSpec(model="m", router_options=options)
    assert spec.router_flags()[:4] == ["--http-port", "8000", "--metrics-port", "9100"]
    argv = ["router", "--workers", "w:1", *spec.router_flags()]
    parsed = vars(build_parser().parse_args(argv))
    assert {k: parsed[k] for k in options} == options
    config = spec.router_config(("w:1",))
    assert (config.http_port, config.health_interval, config.seed) == (8000, 0.2, 0)
    assert (config.health_timeout, config.breaker_failures, config.breaker_cooldown) == (
        0.5,
        1,
        0.25,
    )

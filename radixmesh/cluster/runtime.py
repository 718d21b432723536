"""The launching half of the language's `Runtime`: a local cluster from engine options.

`radixmesh.lang`'s `Runtime(model=..., workers=N, **engine_options)` (SGLang's
`sgl.Runtime`) calls `start_local_cluster` lazily; the processes are the local
launcher's (`launch.LocalCluster`), each worker a `radixmesh worker` whose flags are the
engine options.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.errors import InvalidArgument


def worker_flags(options: Mapping[str, Any]) -> tuple[str, ...]:
    """`Engine(**options)` as `radixmesh worker` flags (the CLI has one flag per option)."""
    from radixmesh.worker.config import option_fields

    known = {name for name, _ in option_fields()} | {"attention_backend"}
    flags: list[str] = []
    for name, value in options.items():
        if name not in known or name == "model":
            raise InvalidArgument(name, "not an engine option a launched worker takes")
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{flag}" if value else f"--no-{flag}")
        elif value is not None:
            flags += [f"--{flag}", str(value)]
    return tuple(flags)


def start_local_cluster(
    model: str,
    workers: int,
    *,
    policy: str = "cache_aware",
    host: str = "127.0.0.1",
    port: int | None = None,
    ready_timeout: float = 300.0,
    engine_options: Mapping[str, Any] | None = None,
    http_port: int | None = None,
) -> LocalCluster:
    """A started cluster whose router serves and sees every worker healthy; on failure
    every process is stopped before the error propagates. `http_port`: the router's HTTP
    API (OpenAI's and SGLang's) on that port too."""
    config = LaunchSpec(
        model=model,
        workers=workers,
        policy=policy,
        host=host,
        port=port or free_port(host),
        worker_args=worker_flags(engine_options or {}),
        router_options={} if http_port is None else {"http_port": http_port},
        ready_timeout=ready_timeout,
    )
    cluster = LocalCluster(config)
    try:
        cluster.start()
        cluster.wait_ready()
    except BaseException:
        cluster.stop()
        raise
    return cluster

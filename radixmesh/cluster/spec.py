"""What `radixmesh launch` starts, whichever backend starts it: one `LaunchSpec`.

The local backend (launch.py) runs the workers and the router as processes of this
machine; the Ray backend (ray_launch.py, when `ray` is set) runs them as Ray actors. Both
read the same fields the same way: `tp_size` ranks per worker (one GPU each when the
workers run on CUDA), `worker_args` as `radixmesh worker` flags, `router_options` as
`RouterConfig` fields (the local router gets them as `radixmesh router` flags), the API
keys and TLS files for the router and for checking that it is ready.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from radixmesh.cluster.child import RestartPolicy
from radixmesh.errors import InvalidArgument
from radixmesh.router.config import RouterConfig
from radixmesh.router.policy import POLICIES

DEVICES = ("auto", "cuda", "cpu")
STRATEGIES = ("STRICT_PACK", "PACK")
# RouterConfig fields the spec sets itself (from its own fields, or per backend).
_SET_BY_THE_SPEC = (
    "workers", "host", "port", "policy", "api_keys", "admin_keys", "tls_cert", "tls_key",
    "worker_api_key",
)  # fmt: skip


@dataclass(frozen=True)
class RayOptions:
    """The Ray backend's own settings."""

    address: str | None = None  # None: start a local Ray instance ("auto": join one)
    cpus_per_worker: float = 1.0  # per tensor-parallel rank
    router_cpus: float = 0.0  # the router mostly waits on sockets; 0 never blocks workers
    max_restarts: int = -1  # Ray restarts a dead worker or router this often (-1: always)
    placement_strategy: str = "STRICT_PACK"
    # None: each worker's /metrics on a free port per (re)start; N: on port N for every
    # worker (one worker per node, e.g. KubeRay's GPU pods behind a headless Service).
    worker_metrics_port: int | None = None
    resolve_timeout: float = 2.0  # seconds the router waits for an actor's address
    # Where the LaunchSpec's `routers` router actors run. "driver": all on the driver's
    # node (the Ray head, where a Service finds them), sharing its gRPC and HTTP ports.
    # "spread": one per node, through a STRICT_SPREAD placement group of one `router_cpus`
    # bundle per router (so it needs router_cpus > 0 and as many nodes as routers).
    router_placement: str = "driver"

    def __post_init__(self) -> None:
        if self.cpus_per_worker < 0 or self.router_cpus < 0:
            name = "cpus_per_worker" if self.cpus_per_worker < 0 else "router_cpus"
            raise InvalidArgument(name, f"must be >= 0, got {getattr(self, name)}")
        if self.max_restarts < -1:
            raise InvalidArgument("max_restarts", f"must be >= -1, got {self.max_restarts}")
        if self.worker_metrics_port is not None and not 0 < self.worker_metrics_port < 65536:
            raise InvalidArgument(
                "worker_metrics_port", f"must be in 1..65535, got {self.worker_metrics_port}"
            )
        if self.placement_strategy not in STRATEGIES:
            raise InvalidArgument(
                "placement_strategy",
                f"must be one of {STRATEGIES}, got {self.placement_strategy!r}",
            )
        if self.router_placement not in ("driver", "spread"):
            raise InvalidArgument(
                "router_placement",
                f"must be one of ('driver', 'spread'), got {self.router_placement!r}",
            )
        if self.router_placement == "spread" and self.router_cpus <= 0:
            raise InvalidArgument(
                "router_cpus",
                "must be > 0 with router_placement 'spread' (each router's placement "
                "group bundle reserves it; Ray refuses empty bundles)",
            )


@dataclass(frozen=True)
class LaunchSpec:
    model: str
    workers: int = 2
    # Router processes (local) or actors (Ray) in front of the workers: each holds every
    # worker's exact cache summary; local ones share the gRPC and HTTP ports (SO_REUSEPORT).
    routers: int = 1
    policy: str = "cache_aware"
    host: str = "127.0.0.1"  # bind address of router and workers; 0.0.0.0: advertise node IPs
    port: int = 50050  # the router's
    tp_size: int = 1  # ranks per worker: its GPUs on CUDA (Ray: one placement group)
    # Where workers run: auto is CUDA when the launcher sees GPUs (local: `visible_gpus`;
    # Ray: the cluster's GPU resources), else the CPU.
    device: str = "auto"
    worker_args: tuple[str, ...] = ()  # extra `radixmesh worker` flags, for every worker
    # RouterConfig fields other than those the spec sets, e.g. {"seed": 0}.
    router_options: dict[str, Any] = field(default_factory=dict, compare=False)
    # The router's API keys (handed over in its environment, not on its command line) and
    # TLS files; the launcher uses them to check readiness (tls_cert as the root: self-signed).
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    tls_cert: str | None = None
    tls_key: str | None = None
    # Keys for the router's admin role (FlushCache, ClusterStatus, aborting any request),
    # in its environment; the launcher checks readiness with the first.
    admin_keys: tuple[str, ...] = field(default=(), repr=False)
    # Workers require this key, given in their environment (never on a command line); the
    # router gets it the same way and sends it on every worker call. None: a key
    # generated at launch.
    worker_api_key: str | None = field(default=None, repr=False)
    ready_timeout: float = 300.0
    stop_timeout: float = 10.0
    # -- the local backend --
    restart: RestartPolicy = field(default_factory=RestartPolicy)  # of a dead child
    worker_ports: tuple[int, ...] = ()  # empty: free ports picked at launch
    env: dict[str, str] | None = field(default=None, compare=False)
    # Workers that share each GPU (group of tp_size GPUs); each is told to take
    # 1 / workers_per_gpu of its memory (`--gpu-memory-share`).
    workers_per_gpu: int = 1
    # GPUs the launcher sees when CUDA_VISIBLE_DEVICES is unset (torch.cuda.device_count()
    # at launch); None: none known (auto then means the CPU).
    visible_gpus: int | None = None
    # -- the Ray backend: set to run the cluster as Ray actors --
    ray: RayOptions | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise InvalidArgument("workers", f"must be >= 1, got {self.workers}")
        if self.routers < 1:
            raise InvalidArgument("routers", f"must be >= 1, got {self.routers}")
        if self.tp_size < 1:
            raise InvalidArgument("tp_size", f"must be >= 1, got {self.tp_size}")
        if self.device not in DEVICES:
            raise InvalidArgument("device", f"must be one of {DEVICES}, got {self.device!r}")
        if self.workers_per_gpu < 1:
            raise InvalidArgument("workers_per_gpu", f"must be >= 1, got {self.workers_per_gpu}")
        if self.worker_ports and len(self.worker_ports) != self.workers:
            raise InvalidArgument("worker_ports", "give one port per worker, or none")
        if self.policy not in POLICIES:
            raise InvalidArgument(
                "policy", f"must be one of {sorted(POLICIES)}, got {self.policy!r}"
            )
        if self.ray is not None and any(
            a == "--metrics-port" or a.startswith("--metrics-port=") for a in self.worker_args
        ):
            raise InvalidArgument(
                "worker_args", "set the workers' metrics port with worker_metrics_port"
            )
        for key in _SET_BY_THE_SPEC:
            if key in self.router_options:
                raise InvalidArgument("router_options", f"set {key!r} on the launch config")
        self.router_config(("127.0.0.1:1",))  # validates port and router_options

    @property
    def gpus_per_worker(self) -> int:
        """GPUs each local worker gets (CUDA_VISIBLE_DEVICES): its tp_size on CUDA, else 0
        (it inherits the launcher's environment)."""
        cuda = self.device == "cuda" or (self.device == "auto" and bool(self.visible_gpus))
        return self.tp_size if cuda else 0

    def router_config(self, workers: tuple[str, ...]) -> RouterConfig:
        return RouterConfig(
            workers=workers,
            host=self.host,
            port=self.port,
            policy=self.policy,
            api_keys=self.api_keys,
            admin_keys=self.admin_keys,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
            worker_api_key=self.worker_api_key,
            **self.router_options,
        )

    def router_flags(self) -> list[str]:
        """`router_options` as `radixmesh router` flags (one flag per RouterConfig field,
        named after it: cluster/router_flags.py; a bool is `--name` or `--no-name`, None is
        left out)."""
        flags: list[str] = []
        for name, value in self.router_options.items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                flags += [flag if value else "--no-" + name.replace("_", "-")]
            elif isinstance(value, tuple | list):
                for item in value:
                    flags += [flag, str(item)]
            elif value is not None:
                flags += [flag, str(value)]
        return flags

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
ROUTER_PLACEMENTS = ("driver", "spread")
WORKER_PLACEMENTS = ("any", "spread")
# RouterConfig fields the spec sets itself (from its own fields, or per backend).
_SET_BY_THE_SPEC = (
    "workers", "host", "port", "policy", "api_keys", "admin_keys", "tls_cert", "tls_key",
    "worker_api_key", "replicas", "replica_index",
)  # fmt: skip


@dataclass(frozen=True)
class RayOptions:
    """The Ray backend's own settings. Each field is a `radixmesh launch` flag of its name
    (launch_flags.py), so the names say Ray where a bare one would be unclear beside the
    local launcher's (`ray_address`, `ray_max_restarts`)."""

    ray_address: str | None = None
    """The Ray cluster to join (e.g. auto); None: start a local Ray instance."""
    cpus_per_worker: float = 1.0
    """CPUs each tensor-parallel rank of a worker reserves."""
    router_cpus: float = 0.0
    """CPUs each router actor reserves (the router mostly waits on sockets: 0 never blocks
    a worker; router_placement spread needs > 0)."""
    ray_max_restarts: int = -1
    """How often Ray restarts a dead worker or router actor, over its life (-1: always). A
    launch given only --max-restarts takes that."""
    placement_strategy: str = "STRICT_PACK"
    """How the ranks of a tensor-parallel worker are placed (its placement group)."""
    worker_metrics_port: int | None = None
    """Each worker's /metrics: free (a free port per (re)start) or PORT for every worker (one
    worker per node, e.g. KubeRay's GPU pods behind a headless Service)."""
    resolve_timeout: float = 2.0
    """Seconds a router waits for an actor's address."""
    router_placement: str = "driver"
    """Where the router actors run: driver (all on the driver's node, the Ray head where a
    Service finds them, sharing its gRPC and HTTP ports) or spread (one per node, through a
    STRICT_SPREAD placement group of one router_cpus bundle per router; needs as many nodes
    as routers)."""
    worker_placement: str = "any"
    """Where the worker actors run (ray_placement.py): any (Ray's scheduler; a
    tensor-parallel worker in a group of its own) or spread (one SPREAD placement group, a
    bundle per worker holding all its ranks: each worker on one node, the workers spread
    evenly over the nodes; a bundle lost with its node is placed again on another node and
    its worker restarted there; needs cpus_per_worker > 0 on CPU)."""
    ray_dashboard: bool = False
    """Start the local Ray instance (no ray_address) with Ray's dashboard and state API
    (`ray list actors --detail`; needs radixmesh[ray]), which show where each worker
    landed; ~200 MB more. A cluster joined keeps its own (ray start runs it)."""

    def __post_init__(self) -> None:
        if self.cpus_per_worker < 0 or self.router_cpus < 0:
            name = "cpus_per_worker" if self.cpus_per_worker < 0 else "router_cpus"
            raise InvalidArgument(name, f"must be >= 0, got {getattr(self, name)}")
        if self.ray_max_restarts < -1:
            raise InvalidArgument("ray_max_restarts", f"must be >= -1, got {self.ray_max_restarts}")
        if self.worker_metrics_port is not None and not 0 < self.worker_metrics_port < 65536:
            raise InvalidArgument(
                "worker_metrics_port", f"must be in 1..65535, got {self.worker_metrics_port}"
            )
        if self.placement_strategy not in STRATEGIES:
            raise InvalidArgument(
                "placement_strategy",
                f"must be one of {STRATEGIES}, got {self.placement_strategy!r}",
            )
        if self.router_placement not in ROUTER_PLACEMENTS:
            raise InvalidArgument(
                "router_placement",
                f"must be one of {ROUTER_PLACEMENTS}, got {self.router_placement!r}",
            )
        if self.worker_placement not in WORKER_PLACEMENTS:
            raise InvalidArgument(
                "worker_placement",
                f"must be one of {WORKER_PLACEMENTS}, got {self.worker_placement!r}",
            )
        if self.router_placement == "spread" and self.router_cpus <= 0:
            raise InvalidArgument(
                "router_cpus",
                "must be > 0 with router_placement 'spread' (each router's placement "
                "group bundle reserves it; Ray refuses empty bundles)",
            )


@dataclass(frozen=True)
class LaunchSpec:
    """One cluster to launch. The fields with a docstring are `radixmesh launch` flags of
    their names (launch_flags.py); the others are set another way (the comment says how)."""

    model: str
    """What every worker serves (smollm2, an HF directory, a .gguf, a hub id org/name)."""
    workers: int = 2
    """Worker processes (Ray: actors)."""
    routers: int = 1
    """Router processes (Ray: actors) in front of the workers, each with every worker's exact
    cache summary; local ones share the gRPC and HTTP ports (SO_REUSEPORT)."""
    policy: str = "cache_aware"
    """How the routers pick a worker (router/policy.py)."""
    host: str = "127.0.0.1"
    """Bind address of the routers and workers; 0.0.0.0: advertise the node's IP."""
    port: int = 50050
    """The routers' gRPC port."""
    tp_size: int = 1
    """Tensor-parallel ranks per worker: its GPUs on CUDA (Ray: one placement group)."""
    device: str = "auto"
    """Where workers run: auto is CUDA when the launcher sees GPUs (local: its own; Ray: the
    cluster's GPU resources), else the CPU. A local launch given cuda or cpu passes it to
    each worker as --device (one --worker-args names otherwise is refused)."""
    worker_args: tuple[str, ...] = ()
    """More `radixmesh worker` flags for every worker, quoted as one argument."""
    # RouterConfig fields other than those the spec sets, e.g. {"seed": 0}: the router's
    # own flags (router_flags.py).
    router_options: dict[str, Any] = field(default_factory=dict, compare=False)
    # The router's API keys (handed over in its environment, not on its command line) and
    # TLS files; the launcher uses them to check readiness (tls_cert as the root: self-signed).
    # The keys are the router's hand-written --api-key flags (cli.py).
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    tls_cert: str | None = None
    """The routers' PEM certificate chain (the launcher trusts it to check readiness)."""
    tls_key: str | None = None
    """The routers' PEM private key."""
    # Keys for the router's admin role (FlushCache, ClusterStatus, aborting any request),
    # in its environment; the launcher checks readiness with the first (--admin-key).
    admin_keys: tuple[str, ...] = field(default=(), repr=False)
    # Workers require this key, given in their environment (never on a command line); the
    # router gets it the same way and sends it on every worker call. None: a key
    # generated at launch.
    worker_api_key: str | None = field(default=None, repr=False)
    ready_timeout: float = 300.0
    """Seconds for the cluster to come up (model downloads and loads included)."""
    stop_timeout: float = 10.0
    """Seconds each process gets to exit on its own when the launcher stops, before a kill."""
    # -- the local backend --
    restart: RestartPolicy = field(default_factory=RestartPolicy)  # of a dead child
    worker_ports: tuple[int, ...] = ()  # empty: free ports picked at launch (not a flag)
    env: dict[str, str] | None = field(default=None, compare=False)  # for the children
    workers_per_gpu: int = 1
    """On CUDA: workers sharing each GPU (each group of tp_size GPUs); each is told to take 1
    / workers_per_gpu of its memory (--gpu-memory-share)."""
    # GPUs the launcher sees when CUDA_VISIBLE_DEVICES is unset (torch.cuda.device_count()
    # at launch); None: none known (auto then means the CPU).
    visible_gpus: int | None = None
    ray: RayOptions | None = None
    """Run the cluster as Ray actors (--ray: on a local Ray instance; --ray-address implies
    it)."""

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

    def router_config(self, workers: tuple[str, ...], index: int = 0) -> RouterConfig:
        """Router replica `index`'s config (of `routers`): behind several, each one places
        cold prompts on its own share of the workers (`--replicas`, `--replica-index`:
        policy.py's cold partition), as the local launch's replicas do."""
        return RouterConfig(
            workers=workers,
            replicas=self.routers,
            replica_index=index,
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

    def replica_flags(self, index: int) -> list[str]:
        """The `radixmesh router` flags of local replica `index` (none for one router):
        replicas share the ports, so none takes connections before it serves; and each
        places cold prompts on its own share of the workers (what `router_config` sets)."""
        if self.routers == 1:
            return []
        return [
            "--listen-when-serving",
            "--replicas",
            str(self.routers),
            "--replica-index",
            str(index),
        ]

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

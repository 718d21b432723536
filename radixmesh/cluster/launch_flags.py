"""`radixmesh launch`'s own flags, generated from the dataclasses they fill (flags.py): one
flag per field of `LaunchSpec`, `RestartPolicy` and `RayOptions` but those in `NOT_FLAGS`,
named after the field, its help the field's docstring, its default the field's; and
`launch_spec` builds the spec from them.

The names are flat (`--cpus-per-worker`, not `--ray-cpus-per-worker`): they were so before
they were generated and scripts, the docs and the Helm and KubeRay files use them; a field
whose bare name would be unclear or clash carries its group in the name instead
(`RayOptions.ray_address`, `RestartPolicy.restart_window`). Two spellings are older than
that rule and keep working: `--ray-device` (now `--device`, which the local launch takes
too) and `--max-restarts` in a Ray launch (the local policy's flag; a Ray launch takes it
as `--ray-max-restarts` when that is not given, as it did when one flag served both).

Besides, six worker options (`WORKER_OPTIONS`, fields of the worker's `ModelConfig`)
are launch flags that every worker gets when given other than their defaults, as the
router flags are handed to every router (router_flags.py); the rest go in --worker-args.
`--deterministic` also makes every router require it of its workers
(`RouterConfig.require_deterministic`), so a worker started apart without it is not used.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from typing import Any

from radixmesh.cluster.child import RestartPolicy
from radixmesh.cluster.flags import (
    add_field_flags,
    field_docs,
    field_values,
    given,
    merged_field_docs,
)
from radixmesh.cluster.router_flags import router_options
from radixmesh.cluster.spec import (
    DEVICES,
    ROUTER_PLACEMENTS,
    STRATEGIES,
    WORKER_PLACEMENTS,
    LaunchSpec,
    RayOptions,
)
from radixmesh.errors import InvalidArgument

# LaunchSpec fields set another way: the router's settings (its own generated flags), the
# keys (the router's hand-written flags and the environment: cli.py), the restart policy
# and the Ray options (their fields are flags; --ray sets `ray`), and what only a program
# gives (fixed worker ports, the children's environment) or the launcher finds itself
# (the GPUs it sees).
NOT_FLAGS = frozenset({
    "router_options", "api_keys", "admin_keys", "worker_api_key", "restart", "ray",
    "worker_ports", "env", "visible_gpus",
})  # fmt: skip
WORKER_OPTIONS = (
    "dtype", "revision", "download_dir", "served_model_name", "chat_template", "deterministic",
)  # fmt: skip
ALIASES = {"device": ("--ray-device",)}


def spec_fields() -> list[dataclasses.Field[Any]]:
    """LaunchSpec's fields that are flags."""
    return [f for f in dataclasses.fields(LaunchSpec) if f.name not in NOT_FLAGS]


def _worker_fields() -> list[dataclasses.Field[Any]]:
    from radixmesh.worker.config import ModelConfig

    return [f for f in dataclasses.fields(ModelConfig) if f.name in WORKER_OPTIONS]


def _worker_docs() -> dict[str, str]:
    from radixmesh.worker.config import OPTION_CLASSES

    return merged_field_docs(OPTION_CLASSES.values())


def _worker_choices() -> dict[str, tuple[str, ...]]:
    from radixmesh.worker.config import DTYPES

    return {"dtype": DTYPES}


def _free_or_port(value: str) -> int | None:
    if value == "free":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'free' or a port, got {value!r}") from None


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
    from radixmesh.router.policy import POLICIES

    choices = {
        "policy": sorted(POLICIES), "device": DEVICES, "placement_strategy": STRATEGIES,
        "router_placement": ROUTER_PLACEMENTS, "worker_placement": WORKER_PLACEMENTS,
    }  # fmt: skip
    parse = {
        "worker_args": (lambda s: tuple(shlex.split(s)), "'FLAGS'"),
        "worker_metrics_port": (_free_or_port, "free|PORT"),
    }
    group = parser.add_argument_group("launch (LaunchSpec: cluster/spec.py)")
    add_field_flags(
        group, spec_fields(), field_docs(LaunchSpec), choices=choices, parse=parse,
        aliases=ALIASES,
    )  # fmt: skip
    group = parser.add_argument_group("restarts of a local launch (RestartPolicy: child.py)")
    add_field_flags(group, dataclasses.fields(RestartPolicy), field_docs(RestartPolicy))
    group = parser.add_argument_group("ray (router and workers as Ray actors: RayOptions)")
    group.add_argument("--ray", action="store_true", help=field_docs(LaunchSpec)["ray"])
    add_field_flags(
        group, dataclasses.fields(RayOptions), field_docs(RayOptions), choices=choices,
        parse=parse,
    )  # fmt: skip
    group = parser.add_argument_group("worker (ModelConfig fields every worker is given)")
    add_field_flags(group, _worker_fields(), _worker_docs(), choices=_worker_choices())


def worker_flags(args: argparse.Namespace) -> list[str]:
    """The worker options given other than their defaults, as `radixmesh worker` flags."""
    flags: list[str] = []
    for f in _worker_fields():
        value = getattr(args, f.name)
        if value == f.default:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags


def launch_spec(
    args: argparse.Namespace,
    *,
    api_keys: tuple[str, ...],
    admin_keys: tuple[str, ...],
    worker_api_key: str | None,
) -> LaunchSpec:
    """The spec the launch flags describe, with the keys the CLI found (flags or the
    environment)."""
    values = field_values(args, spec_fields())
    ray = args.ray or args.ray_address is not None
    worker_args = [*values.pop("worker_args"), *worker_flags(args)]
    options = router_options(args, launch=True)
    if args.deterministic:
        options["require_deterministic"] = True
    if args.download_dir is not None and not ray:  # Ray's routers use their node's cache
        options["download_dir"] = args.download_dir
    device, visible = values.pop("device"), None
    if not ray:
        device, visible = _local_device(device, worker_args)
    return LaunchSpec(
        **values,
        device=device,
        visible_gpus=visible,
        worker_args=tuple(worker_args),
        router_options=options,
        api_keys=api_keys,
        admin_keys=admin_keys,
        worker_api_key=worker_api_key,
        restart=RestartPolicy(**field_values(args, dataclasses.fields(RestartPolicy))),
        ray=_ray_options(args) if ray else None,
    )


def _ray_options(args: argparse.Namespace) -> RayOptions:
    values = field_values(args, dataclasses.fields(RayOptions))
    flags = given(args)
    if "max_restarts" in flags and "ray_max_restarts" not in flags:
        values["ray_max_restarts"] = args.max_restarts
    return RayOptions(**values)


def _local_device(device: str, worker_args: list[str]) -> tuple[str, int | None]:
    """(where local workers run, GPUs visible): CUDA, each worker on its own tp_size GPUs,
    when the workers will run on CUDA; the CPU when they will not. A device other than
    auto is also each worker's --device; one --worker-args names otherwise is refused
    rather than guessed at."""
    devices = [worker_args[i + 1] for i, w in enumerate(worker_args[:-1]) if w == "--device"]
    devices += [w.split("=", 1)[1] for w in worker_args if w.startswith("--device=")]
    if device != "auto":
        if any(d != device for d in devices):
            raise InvalidArgument(
                "device", f"{device!r}, but --worker-args give --device {devices[-1]!r}"
            )
        worker_args += ["--device", device]
        devices.append(device)
    if any(not d.startswith("cuda") and d != "auto" for d in devices):
        return "cpu", None
    import torch

    if not torch.cuda.is_available():
        return "cpu", None
    return "cuda", torch.cuda.device_count()

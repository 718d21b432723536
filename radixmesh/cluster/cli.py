"""The `radixmesh` command line.

Engine options are generated from the config dataclasses' fields in one place
(`add_engine_options`), so every option of `Engine(**options)` is also a flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixmesh.cluster.env import (
    ADMIN_KEY_ENV,
    API_KEY_ENV,
    HEALTH_ADDRESS_ENV,
    WORKER_API_KEY_ENV,
)
from radixmesh.errors import RadixMeshError
from radixmesh.listener import LISTENER_FLAGS

if TYPE_CHECKING:
    from radixmesh.cluster.spec import RayOptions


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    from radixmesh.worker.config import EngineConfig, option_fields

    group = parser.add_argument_group("engine")
    for name, f in option_fields():
        flag = "--" + name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        kind = _base_type(f.type)
        if kind is bool:
            group.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=default
            )
        else:
            group.add_argument(
                flag, dest=name, type=kind, default=default, help=f"(default: {default})"
            )
    top = {f.name: f for f in dataclasses.fields(EngineConfig)}
    group.add_argument(
        "--attention-backend", dest="attention_backend", default=top["attention_backend"].default
    )


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    from radixmesh.worker.config import option_fields

    names = [name for name, _ in option_fields()] + ["attention_backend"]
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def _base_type(annotation: Any) -> type:
    """'int | None' -> int (annotations are strings under `from __future__ import annotations`)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if isinstance(annotation, (types.UnionType,)) or typing.get_origin(annotation) is typing.Union:
        text = " | ".join(getattr(a, "__name__", str(a)) for a in typing.get_args(annotation))
    for name, typ in (("bool", bool), ("int", int), ("float", float)):
        if text.split(" | ")[0] == name:
            return typ
    return str


def _cmd_generate(args: argparse.Namespace) -> int:
    from radixmesh.worker.engine import Engine

    engine = Engine(**engine_options(args))
    try:
        prompt = " ".join(args.prompt)
        if args.raw:
            ids = engine.tokenizer.encode(prompt)
        else:
            ids = engine.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        params = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
        if args.top_p is not None:
            params["top_p"] = args.top_p
        if args.stream:
            for chunk in engine.generate(input_ids=ids, sampling_params=params, stream=True):
                assert isinstance(chunk, dict)
                print(chunk["text"], end="", flush=True)
            print()
        else:
            out = engine.generate(input_ids=ids, sampling_params=params)
            assert isinstance(out, dict)
            print(out["text"])
    finally:
        engine.shutdown()
    from radixmesh.worker.tp.group import exit_if_group_alive

    exit_if_group_alive(0)  # TP on CUDA: the NCCL group outlives the engine
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    import os

    from radixmesh.worker.server import ServerConfig, run

    config = ServerConfig(
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        drain_timeout=args.drain_timeout,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        engine_process=args.engine_process,
        tls_client_ca=args.tls_client_ca,
        log_stats_interval=args.log_stats_interval,
    )
    return run(config, engine_options(args))


def _add_worker_parser(sub: Any) -> None:
    wk = sub.add_parser("worker", help="serve one model over gRPC (radixmesh.v1.Worker)")
    wk.add_argument("--host", default="0.0.0.0")
    wk.add_argument("--port", type=int, default=50051)
    wk.add_argument("--metrics-port", type=int, default=None, help="Prometheus /metrics port")
    wk.add_argument("--drain-timeout", type=float, default=30.0, help="seconds, on SIGTERM")
    wk.add_argument(
        "--api-key",
        default=None,
        help=f"require `authorization: Bearer <key>` (default: ${API_KEY_ENV}, kept out of ps)",
    )
    wk.add_argument("--tls-cert", default=None, help="PEM certificate chain (with --tls-key)")
    wk.add_argument("--tls-key", default=None, help="PEM private key")
    wk.add_argument(
        "--engine-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the engine in a child process, apart from the gRPC server",
    )
    wk.add_argument("--tls-client-ca", default=None, help="require client certificates (mTLS)")
    wk.add_argument(
        "--log-stats-interval", type=float, default=10.0, help="seconds between stats lines"
    )
    add_engine_options(wk)
    wk.set_defaults(func=_cmd_worker)


def _cmd_router(args: argparse.Namespace) -> int:
    from radixmesh.router.config import RouterConfig
    from radixmesh.router.server import run

    config = RouterConfig(
        workers=tuple(a for a in args.workers.split(",") if a),
        host=args.host,
        port=args.port,
        policy=args.policy,
        seed=args.seed,
        summary_budget_bytes=args.summary_budget_bytes,
        tentative_ttl=args.tentative_ttl,
        health_interval=args.health_interval,
        program_max_queued=args.program_max_queued,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        api_keys=router_api_keys(args.api_key),
        admin_keys=router_api_keys(args.admin_key, ADMIN_KEY_ENV),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        worker_api_key=_worker_api_key(),
        download_dir=args.download_dir,
        worker_tls_ca=args.worker_tls_ca,
        worker_tls_cert=args.worker_tls_cert,
        worker_tls_key=args.worker_tls_key,
        worker_tls_server_name=args.worker_tls_server_name,
        discovery_interval=args.discovery_interval,
        strict_openai=args.strict_openai,
        tool_call_parser=args.tool_call_parser,
        separate_reasoning=args.separate_reasoning,
        per_request_streams=args.per_request_streams,
        listen_when_serving=args.listen_when_serving,
        **{name: getattr(args, name) for name, _ in ROUTER_LIMITS},
    )
    return run(config)


# RouterConfig's admission and limit fields, a flag each (help: the field's comment block
# in router/config.py and docs/reliability.md).
ROUTER_LIMITS = (
    ("max_concurrent_requests", "requests on the workers at once (0: no cap)"),
    ("max_queued_requests", "requests waiting for a turn beyond that"),
    ("queue_timeout", "seconds a request may wait for a turn"),
    ("rate_limit", "requests a second per caller (0: no limit)"),
    ("rate_burst", "requests at once per caller (0: the rate, rounded up)"),
    ("stream_stall_timeout", "seconds a worker stream may send nothing"),
    ("drain_timeout", "seconds requests in flight get to finish on SIGTERM"),
    ("max_prompt_bytes", "UTF-8 bytes of prompt text per request"),
    ("max_body_bytes", "bytes of an HTTP request body"),
    ("max_choices", "prompts x n per request (and choices of a select)"),
    ("max_top_logprobs", "top logprobs per token"),
    ("health_timeout", "seconds a worker's health check may take"),
    ("breaker_failures", "consecutive failures that stop routing to a worker for a while"),
    ("breaker_cooldown", "seconds before a stopped worker gets a trial request"),
    *LISTENER_FLAGS,
)


def _router_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The limit flags given other values than RouterConfig's defaults."""
    from radixmesh.router.config import RouterConfig

    defaults = {f.name: f.default for f in dataclasses.fields(RouterConfig)}
    values = {name: getattr(args, name) for name, _ in ROUTER_LIMITS}
    return {name: v for name, v in values.items() if v != defaults[name]}


def _add_router_limits(parser: argparse.ArgumentParser) -> None:
    from radixmesh.router.config import RouterConfig

    group = parser.add_argument_group("admission, limits and faults (docs/reliability.md)")
    defaults = {f.name: f.default for f in dataclasses.fields(RouterConfig)}
    for name, what in ROUTER_LIMITS:
        default = defaults[name]
        group.add_argument(
            "--" + name.replace("_", "-"),
            type=type(default),
            default=default,
            help=f"{what} (default: {default})",
        )


def _worker_api_key() -> str | None:
    import os

    return os.environ.get(WORKER_API_KEY_ENV) or None


def router_api_keys(flags: Sequence[str] | None, env: str = API_KEY_ENV) -> tuple[str, ...]:
    """The keys given by flags, else those in the environment variable `env`."""
    import os

    if flags:
        return tuple(flags)
    return tuple(k for k in os.environ.get(env, "").split(",") if k)


def _add_router_security_options(parser: argparse.ArgumentParser) -> None:
    from radixmesh.router.config import TOOL_CALL_PARSERS

    parser.add_argument("--http-port", type=int, default=None, help="OpenAI-compatible HTTP API")
    parser.add_argument("--metrics-port", type=int, default=None, help="Prometheus /metrics")
    parser.add_argument(
        "--strict-openai",
        action="store_true",
        help="refuse unknown fields in OpenAI requests (400) instead of ignoring them",
    )
    parser.add_argument(
        "--tool-call-parser",
        default="auto",
        choices=TOOL_CALL_PARSERS,
        help="the model's tool-call syntax (default: read from its chat template)",
    )
    parser.add_argument(
        "--separate-reasoning",
        action="store_true",
        help="return <think>...</think> as reasoning_content unless a request says otherwise",
    )
    parser.add_argument(
        "--per-request-streams",
        action="store_true",
        help="read each request's chunks on its own worker call, not the worker's output stream",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        default=None,
        help=f"require `authorization: Bearer <key>` (repeatable; default: ${API_KEY_ENV})",
    )
    parser.add_argument(
        "--admin-key",
        action="append",
        default=None,
        help="require this key for FlushCache, ClusterStatus and aborting others' requests "
        f"(repeatable; default: ${ADMIN_KEY_ENV}; none: the API keys)",
    )
    parser.add_argument("--tls-cert", default=None, help="PEM certificate chain (with --tls-key)")
    parser.add_argument("--tls-key", default=None, help="PEM private key")


def _add_router_tls_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-client-ca", default=None, help="require client certificates")
    tls = parser.add_argument_group("router -> worker TLS")
    tls.add_argument("--worker-tls-ca", default=None, help="CA of the workers' certificates")
    tls.add_argument("--worker-tls-cert", default=None, help="client certificate (mTLS)")
    tls.add_argument("--worker-tls-key", default=None, help="its private key")
    tls.add_argument(
        "--worker-tls-server-name", default=None, help="name the workers' certificates carry"
    )


def _add_router_parser(sub: Any) -> None:
    from radixmesh.router.policy import POLICIES

    rt = sub.add_parser("router", help="route requests over workers (radixmesh.v1.Router)")
    rt.add_argument(
        "--workers",
        required=True,
        help="worker addresses, host:port,host:port; dns:name:port for every address a "
        "name resolves to (re-resolved: a headless Service)",
    )
    rt.add_argument("--discovery-interval", type=float, default=5.0, help="seconds")
    rt.add_argument("--download-dir", default=None, help="Hugging Face hub cache")
    rt.add_argument("--host", default="0.0.0.0")
    rt.add_argument("--port", type=int, default=50050)
    rt.add_argument("--policy", default="cache_aware", choices=sorted(POLICIES))
    rt.add_argument("--seed", type=int, default=None, help="seed of the policy's random draws")
    rt.add_argument("--summary-budget-bytes", type=int, default=256 * 1024 * 1024)
    rt.add_argument("--tentative-ttl", type=float, default=5.0, help="seconds")
    rt.add_argument("--health-interval", type=float, default=1.0, help="seconds")
    rt.add_argument(
        "--listen-when-serving",
        action="store_true",
        help="open the ports only once serving (replicas sharing ports on one host)",
    )
    rt.add_argument(
        "--program-max-queued",
        type=int,
        default=32,
        help="a program's requests stay on its worker while it has fewer queued (0: off)",
    )
    _add_router_security_options(rt)
    _add_router_tls_options(rt)
    _add_router_limits(rt)
    rt.set_defaults(func=_cmd_router)


def _cmd_launch(args: argparse.Namespace) -> int:
    import shlex

    from radixmesh.cluster.child import RestartPolicy
    from radixmesh.cluster.spec import LaunchSpec

    worker_args = shlex.split(args.worker_args)
    if args.dtype is not None:
        worker_args += ["--dtype", args.dtype]
    for flag in ("revision", "download_dir", "served_model_name", "chat_template"):
        if getattr(args, flag) is not None:
            worker_args += ["--" + flag.replace("_", "-"), getattr(args, flag)]
    ray = args.ray or args.ray_address is not None
    router_options: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("http_port", "metrics_port") + (() if ray else ("download_dir",))
        if getattr(args, name, None) is not None
    }
    for flag in ("strict_openai", "separate_reasoning", "per_request_streams"):
        if getattr(args, flag):
            router_options[flag] = True
    if args.tool_call_parser != "auto":
        router_options["tool_call_parser"] = args.tool_call_parser
    router_options |= _router_limits(args)
    device, visible = (args.ray_device, None) if ray else _local_device(args)
    spec = LaunchSpec(
        model=args.model,
        workers=args.workers,
        routers=args.routers,
        policy=args.policy,
        host=args.host,
        port=args.port,
        tp_size=args.tp_size,
        device=device,
        worker_args=tuple(worker_args),
        router_options=router_options,
        api_keys=router_api_keys(args.api_key),
        admin_keys=router_api_keys(args.admin_key, ADMIN_KEY_ENV),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        worker_api_key=_worker_api_key(),
        workers_per_gpu=args.workers_per_gpu,
        visible_gpus=visible,
        restart=RestartPolicy(
            5 if args.max_restarts is None else args.max_restarts, args.restart_backoff
        ),
        ray=_ray_options(args) if ray else None,
    )
    if spec.ray is not None:
        from radixmesh.cluster.ray_launch import launch as launch_ray

        return launch_ray(spec)
    from radixmesh.cluster.launch import launch

    return launch(spec)


def _ray_options(args: argparse.Namespace) -> RayOptions:
    from radixmesh.cluster.spec import RayOptions

    return RayOptions(
        address=args.ray_address,
        max_restarts=-1 if args.max_restarts is None else args.max_restarts,
        cpus_per_worker=args.cpus_per_worker,
        worker_metrics_port=args.worker_metrics_port,
        router_placement=args.router_placement,
        router_cpus=args.router_cpus,
    )


def _local_device(args: argparse.Namespace) -> tuple[str, int | None]:
    """(where local workers run, GPUs visible): CUDA, each worker on its own tp_size GPUs,
    when the workers will run on CUDA; the CPU when they will not."""
    import shlex

    words = shlex.split(args.worker_args)
    devices = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--device"]
    devices += [w.split("=", 1)[1] for w in words if w.startswith("--device=")]
    if any(not d.startswith("cuda") and d != "auto" for d in devices):
        return "cpu", None
    import torch

    if not torch.cuda.is_available():
        return "cpu", None
    return "cuda", torch.cuda.device_count()


def _add_ray_options(parser: argparse.ArgumentParser) -> None:
    ray = parser.add_argument_group("ray (router and workers as Ray actors)")
    ray.add_argument("--ray", action="store_true", help="start a local Ray instance")
    ray.add_argument("--ray-address", default=None, help="join a Ray cluster (e.g. auto)")
    ray.add_argument("--tp-size", type=int, default=1, help="GPUs per worker (a placement group)")
    ray.add_argument("--ray-device", default="auto", choices=("auto", "cuda", "cpu"))
    ray.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        help="restarts of each dead worker or router (local default 5; Ray: -1, always)",
    )
    ray.add_argument(
        "--restart-backoff",
        type=float,
        default=1.0,
        help="seconds before a local child's first restart, doubling each time",
    )
    ray.add_argument("--cpus-per-worker", type=float, default=1.0, help="per rank")
    ray.add_argument(
        "--router-placement",
        default="driver",
        choices=("driver", "spread"),
        help="the router actors: all on the driver's node, or one per node",
    )
    ray.add_argument(
        "--router-cpus",
        type=float,
        default=0.0,
        help="CPUs each router actor reserves (spread needs > 0)",
    )
    ray.add_argument(
        "--worker-metrics-port",
        type=_free_or_port,
        default=None,
        metavar="free|PORT",
        help="each worker's /metrics: free (default: a free port per (re)start) or PORT "
        "for every worker (one worker per node, as on KubeRay's GPU pods)",
    )


def _free_or_port(value: str) -> int | None:
    if value == "free":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'free' or a port, got {value!r}") from None


def _add_launch_parser(sub: Any) -> None:
    from radixmesh.router.policy import POLICIES

    ln = sub.add_parser("launch", help="run a router and N workers as local processes")
    ln.add_argument("--model", required=True)
    ln.add_argument("--workers", type=int, default=2)
    ln.add_argument(
        "--routers",
        type=int,
        default=1,
        help="router processes (Ray: actors) sharing the router's ports, each with every "
        "worker's cache summary",
    )
    ln.add_argument("--policy", default="cache_aware", choices=sorted(POLICIES))
    ln.add_argument("--host", default="127.0.0.1")
    ln.add_argument("--port", type=int, default=50050, help="the router's port")
    ln.add_argument("--dtype", default=None)
    ln.add_argument(
        "--workers-per-gpu",
        type=int,
        default=1,
        help="on CUDA: workers sharing each GPU (each takes 1/N of its memory)",
    )
    ln.add_argument("--revision", default=None, help="of a hub model (org/name)")
    ln.add_argument("--download-dir", default=None, help="Hugging Face hub cache")
    ln.add_argument("--served-model-name", default=None, help="the name clients see")
    ln.add_argument("--chat-template", default=None, help="Jinja file replacing the model's")
    ln.add_argument("--worker-args", default="", help="more `radixmesh worker` flags, quoted")
    _add_router_security_options(ln)
    _add_router_limits(ln)
    _add_ray_options(ln)
    ln.set_defaults(func=_cmd_launch)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixmesh", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="complete one prompt with the chat template applied")
    gen.add_argument("prompt", nargs="+", help="the user message")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--raw", action="store_true", help="no chat template: plain completion")
    gen.add_argument("--stream", action="store_true", help="print tokens as they come")
    add_engine_options(gen)
    gen.set_defaults(func=_cmd_generate)
    _add_worker_parser(sub)
    _add_router_parser(sub)
    _add_launch_parser(sub)
    _add_download_parser(sub)
    _add_health_parser(sub)
    return parser


def _cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when the server at the address answers grpc.health.v1 with SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if args.tls_ca:
        files = [args.tls_ca, args.tls_key, args.tls_cert]
        pem = [Path(p).read_bytes() if p else None for p in files]
        options = []
        if args.tls_server_name:
            options.append(("grpc.ssl_target_name_override", args.tls_server_name))
        channel = grpc.secure_channel(args.address, grpc.ssl_channel_credentials(*pem), options)
    else:
        channel = grpc.insecure_channel(args.address)
    with channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=args.timeout
            )
        except grpc.RpcError as e:
            print(f"radixmesh: {args.address}: {e.code().name}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    print(f"{args.address}: {status}")
    return 0 if resp.status == health_pb2.HealthCheckResponse.SERVING else 1


def _add_health_parser(sub: Any) -> None:
    import os

    hc = sub.add_parser("health", help="exit 0 if a worker or router serves (gRPC health)")
    hc.add_argument(
        "--address",
        default=os.environ.get(HEALTH_ADDRESS_ENV, "127.0.0.1:50051"),
        help=f"host:port (default: ${HEALTH_ADDRESS_ENV} or 127.0.0.1:50051)",
    )
    hc.add_argument("--tls-ca", default=None, help="connect with TLS, trusting this CA")
    hc.add_argument("--tls-server-name", default=None, help="the name the certificate carries")
    hc.add_argument("--tls-cert", default=None, help="client certificate (mutual TLS)")
    hc.add_argument("--tls-key", default=None, help="its private key")
    hc.add_argument("--timeout", type=float, default=5.0, help="seconds")
    hc.set_defaults(func=_cmd_health)


def _cmd_download(args: argparse.Namespace) -> int:
    from radixmesh import hub

    model = hub.parse_hub_id(args.model, args.revision)
    if model is None:
        from radixmesh.errors import InvalidArgument

        raise InvalidArgument("model", f"{args.model!r} is not a hub id (org/name[@revision])")
    path = hub.snapshot(model, args.download_dir, weights=not args.tokenizer_only)
    print(path)
    return 0


def _add_download_parser(sub: Any) -> None:
    dl = sub.add_parser(
        "download", help="fetch a hub model into the Hugging Face cache; print its directory"
    )
    dl.add_argument("model", help="org/name[@revision]")
    dl.add_argument("--revision", default=None)
    dl.add_argument("--download-dir", default=None, help="the hub cache (default: HF's)")
    dl.add_argument("--tokenizer-only", action="store_true", help="what a router needs")
    dl.set_defaults(func=_cmd_download)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except RadixMeshError as e:
        print(f"radixmesh: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

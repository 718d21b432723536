"""The `radixmesh` command line.

The settings' flags are generated from their config dataclasses' fields (flags.py): the
engine options here (`add_engine_options`), so every option of `Engine(**options)` is also
a flag; the router's in router_flags.py; the launcher's own in launch_flags.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from radixmesh.cluster.env import (
    ADMIN_KEY_ENV,
    API_KEY_ENV,
    HEALTH_ADDRESS_ENV,
    WORKER_API_KEY_ENV,
)
from radixmesh.errors import RadixMeshError


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    from radixmesh.cluster.flags import add_field_flags, merged_field_docs
    from radixmesh.worker.config import OPTION_CLASSES, EngineConfig, option_fields

    group = parser.add_argument_group("engine")
    top = [f for f in dataclasses.fields(EngineConfig) if f.name == "attention_backend"]
    docs = merged_field_docs([*OPTION_CLASSES.values(), EngineConfig])
    add_field_flags(group, [f for _, f in option_fields()] + top, docs)


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    from radixmesh.worker.config import option_fields

    names = [name for name, _ in option_fields()] + ["attention_backend"]
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


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

    from radixmesh.cluster.parent import watch_parent
    from radixmesh.worker.resumable import ResumeConfig
    from radixmesh.worker.server import ServerConfig
    from radixmesh.worker.serving import run

    watch_parent()
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
        resume=ResumeConfig(grace=args.resume_grace, max_bytes=args.resume_max_bytes),
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
    wk.add_argument(
        "--resume-grace",
        type=float,
        default=30.0,
        help="seconds a resumable stream whose router went away is held for a resume",
    )
    wk.add_argument(
        "--resume-max-bytes",
        type=int,
        default=64 * 1024 * 1024,
        help="output bytes held for resumable streams no router follows",
    )
    add_engine_options(wk)
    wk.set_defaults(func=_cmd_worker)


def _cmd_router(args: argparse.Namespace) -> int:
    from radixmesh.cluster.parent import watch_parent
    from radixmesh.cluster.router_flags import router_options
    from radixmesh.router.config import RouterConfig
    from radixmesh.router.server import run

    watch_parent()
    config = RouterConfig(
        workers=tuple(a for a in args.workers.split(",") if a),
        api_keys=router_api_keys(args.api_key),
        admin_keys=router_api_keys(args.admin_key, ADMIN_KEY_ENV),
        worker_api_key=_worker_api_key(),
        **router_options(args, launch=False),
    )
    return run(config)


def _worker_api_key() -> str | None:
    import os

    return os.environ.get(WORKER_API_KEY_ENV) or None


def router_api_keys(flags: Sequence[str] | None, env: str = API_KEY_ENV) -> tuple[str, ...]:
    """The keys given by flags, else those in the environment variable `env`."""
    import os

    if flags:
        return tuple(flags)
    return tuple(k for k in os.environ.get(env, "").split(",") if k)


def _add_router_keys(parser: argparse.ArgumentParser) -> None:
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
        help="require this key for FlushCache, ClusterStatus, the workers in /get_server_info "
        f"and aborting others' requests (repeatable; default: ${ADMIN_KEY_ENV}; none: the "
        "API keys see the cluster, and none reaches another caller's requests)",
    )


def _add_router_parser(sub: Any) -> None:
    from radixmesh.cluster.router_flags import add_router_flags

    rt = sub.add_parser("router", help="route requests over workers (radixmesh.v1.Router)")
    rt.add_argument(
        "--workers",
        required=True,
        help="worker addresses, host:port,host:port; dns:name:port for every address a "
        "name resolves to (re-resolved: a headless Service)",
    )
    _add_router_keys(rt)
    add_router_flags(rt, launch=False)
    rt.set_defaults(func=_cmd_router)


def _cmd_launch(args: argparse.Namespace) -> int:
    from radixmesh.cluster.launch_flags import launch_spec

    spec = launch_spec(
        args,
        api_keys=router_api_keys(args.api_key),
        admin_keys=router_api_keys(args.admin_key, ADMIN_KEY_ENV),
        worker_api_key=_worker_api_key(),
    )
    if spec.ray is not None:
        from radixmesh.cluster.ray_launch import launch as launch_ray

        return launch_ray(spec)
    from radixmesh.cluster.launch import launch

    return launch(spec)


def _add_launch_parser(sub: Any) -> None:
    from radixmesh.cluster.launch_flags import add_launch_flags
    from radixmesh.cluster.router_flags import add_router_flags

    ln = sub.add_parser("launch", help="run a router and N workers as local processes")
    add_launch_flags(ln)
    _add_router_keys(ln)
    add_router_flags(ln, launch=True)
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

"""What every radixmesh gRPC server has, shared by the worker's and the router's: the
standard health service and server reflection next to its own service, one port,
plaintext or TLS, and errors ended with the catalogue's status."""

from __future__ import annotations

from typing import NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from radixmesh.errors import FIELD_METADATA_KEY, InvalidArgument, entry_for


def add_health_and_reflection(server: grpc.aio.Server, service: str) -> health.aio.HealthServicer:
    """Register `grpc.health.v1` and reflection (listing `service` too); the health
    servicer is returned NOT_SERVING-ready for `set_health`."""
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    reflection.enable_server_reflection(
        (service, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    return servicer


def bind(
    server: grpc.aio.Server,
    address: str,
    tls_cert: str | None,
    tls_key: str | None,
    client_ca: str | None = None,
) -> int:
    """Listen on `address` (TLS when both PEM files are given; with `client_ca`, mutual
    TLS: clients must present a certificate that CA signed); returns the bound port."""
    if tls_cert and tls_key:
        with open(tls_key, "rb") as k, open(tls_cert, "rb") as c:
            pair = (k.read(), c.read())
        if client_ca:
            with open(client_ca, "rb") as f:
                creds = grpc.ssl_server_credentials(
                    [pair], root_certificates=f.read(), require_client_auth=True
                )
        else:
            creds = grpc.ssl_server_credentials([pair])
        return server.add_secure_port(address, creds)
    return server.add_insecure_port(address)


async def set_health(servicer: health.aio.HealthServicer, service: str, *, serving: bool) -> None:
    """Set the overall status and `service`'s."""
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", service):
        await servicer.set(name, status)


async def abort_rpc(context: grpc.aio.ServicerContext, error: BaseException) -> NoReturn:
    """End the RPC with the catalogue's status for `error` (never UNKNOWN); an
    InvalidArgument names its field in the trailing metadata."""
    entry = entry_for(error)
    metadata: tuple[tuple[str, str], ...] = ()
    if isinstance(error, InvalidArgument):
        metadata = ((FIELD_METADATA_KEY, error.field),)
    await context.abort(grpc.StatusCode[entry.grpc_status], str(error), trailing_metadata=metadata)
    raise AssertionError("unreachable: context.abort raises")

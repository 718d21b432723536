"""API keys and TLS on the router, over a launched one-worker dummy:tiny cluster.

The certificate is self-signed, made here with the `openssl` CLI, for 127.0.0.1. The
launcher hands the keys to the router in its environment and checks readiness over TLS
with a key, so the cluster coming up at all already exercises both.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from radixmesh.auth import bearer_allowed
from radixmesh.client import Client
from radixmesh.cluster.cli import build_parser, router_api_keys
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.errors import Unauthenticated
from radixmesh.router.config import RouterConfig
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc
from tests.router.http_helpers import Http
from tests.tls import self_signed

KEYS = ("key-alpha", "key-beta")
WORKER_KEY = "worker-key"


# ---- without processes ------------------------------------------------------------------------


def test_bearer_allowed() -> None:
    assert bearer_allowed(None, ())  # no keys configured: open
    assert bearer_allowed("Bearer key-beta", KEYS)
    assert not bearer_allowed("Bearer key-gamma", KEYS)
    assert not bearer_allowed("key-alpha", KEYS)  # no scheme
    assert not bearer_allowed(None, KEYS)


def test_config_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="api_keys"):
        RouterConfig(workers=("a:1",), api_keys=("",))
    with pytest.raises(ValueError, match="tls_cert"):
        RouterConfig(workers=("a:1",), tls_key="k.pem")
    with pytest.raises(ValueError, match="http_port"):
        RouterConfig(workers=("a:1",), http_port=70000)
    with pytest.raises(ValueError, match="worker_api_key"):
        RouterConfig(workers=("a:1",), worker_api_key="")
    assert "secret" not in repr(RouterConfig(workers=("a:1",), worker_api_key="secret"))
    monkeypatch.setenv("RADIXMESH_API_KEY", "one,two")
    assert router_api_keys(None) == ("one", "two")
    assert router_api_keys(["flag"]) == ("flag",)
    flags = ["--api-key", "k1", "--api-key", "k2", "--http-port", "8000"]
    flags += ["--metrics-port", "9100", "--tls-cert", "c.pem", "--tls-key", "k.pem"]
    for command in (["router", "--workers", "a:1"], ["launch", "--model", "m"]):
        args = build_parser().parse_args([*command, *flags])
        assert (args.api_key, args.http_port, args.metrics_port) == (["k1", "k2"], 8000, 9100)
        assert (args.tls_cert, args.tls_key) == ("c.pem", "k.pem")


# ---- a cluster with keys and TLS --------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


class SecureCluster:
    def __init__(self, cluster: LocalCluster, http_port: int, cert: Path) -> None:
        self.cluster = cluster
        self.address = cluster.address
        self.root = cert.read_bytes()
        self.http_port = http_port
        self.ssl = ssl.create_default_context(cafile=str(cert))


@pytest.fixture(scope="module")
def secure(certificate: tuple[Path, Path]) -> Iterator[SecureCluster]:
    cert, key = certificate
    http_port = free_port()
    config = LaunchSpec(
        model="dummy:tiny",
        workers=1,
        port=free_port(),
        worker_args=("--dtype", "float32"),
        router_options={"http_port": http_port},
        api_keys=KEYS,
        tls_cert=str(cert),
        tls_key=str(key),
        worker_api_key=WORKER_KEY,  # so every routed call below also proves the router sends it
        ready_timeout=120.0,
    )
    with LocalCluster(config) as cluster:
        yield SecureCluster(cluster, http_port, cert)


GENERATE = router_pb2.RouterGenerateRequest(
    input=common_pb2.Input(text="hello"),
    sampling_params=common_pb2.SamplingParams(max_new_tokens=3, temperature=0.0, ignore_eos=True),
)


@pytest.mark.slow
def test_grpc_needs_a_key_but_health_does_not(secure: SecureCluster) -> None:
    creds = grpc.ssl_channel_credentials(secure.root)
    with grpc.secure_channel(secure.address, creds) as ch:
        stub = router_pb2_grpc.RouterStub(ch)
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Generate(GENERATE, metadata=metadata, timeout=30))
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:
            stub.ClusterStatus(router_pb2.ClusterStatusRequest(), timeout=30)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        (resp,) = list(
            stub.Generate(GENERATE, metadata=(("authorization", "Bearer key-beta"),), timeout=30)
        )
        assert resp.chunk.completion_tokens == 3


@pytest.mark.slow
def test_plaintext_to_the_tls_port_fails(secure: SecureCluster) -> None:
    with grpc.insecure_channel(secure.address) as ch, pytest.raises(grpc.RpcError) as e:
        health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.slow
def test_sdk_round_trip_over_tls(secure: SecureCluster) -> None:
    params = {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True}
    with Client(secure.address, api_key="key-alpha", root_certificates=secure.root) as client:
        done = client.generate("hello", params)
        streamed = [t for c in client.generate("hello", params, stream=True) for t in c.token_ids]
    assert done.completion_tokens == 3
    assert streamed == done.token_ids
    wrong = Client(secure.address, api_key="nope", root_certificates=secure.root)
    with wrong, pytest.raises(Unauthenticated):
        wrong.generate("hello", params)


@pytest.mark.slow
def test_https_needs_a_key(secure: SecureCluster) -> None:
    anonymous = Http(secure.http_port, context=secure.ssl)
    resp = anonymous.get("/v1/models")
    assert resp.status_code == 401
    assert resp.json()["error"]["type"] == "authentication_error"
    assert resp.json()["error"]["code"] == "invalid_api_key"
    assert anonymous.get("/health").status_code == 200  # open, like gRPC health
    keyed = Http(secure.http_port, context=secure.ssl, api_key="key-beta")
    assert keyed.get("/v1/models").json()["data"][0]["id"] == "dummy:tiny"
    body = {"model": "dummy:tiny", "prompt": "hi", "max_tokens": 2, "ignore_eos": True}
    assert keyed.post("/v1/completions", body).json()["usage"]["completion_tokens"] == 2
    native = {"text": "hi", "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
    assert anonymous.post("/generate", native).status_code == 401  # SGLang's API too
    assert anonymous.get("/get_server_info").status_code == 401
    assert keyed.post("/generate", native).json()["meta_info"]["completion_tokens"] == 2
    metrics = anonymous.get("/metrics").text
    denied = 'endpoint="/v1/models",frontend="http",status="UNAUTHENTICATED"'
    assert f"radixmesh_router_requests_total{{{denied}}} 1.0" in metrics.splitlines()


@pytest.mark.slow
def test_workers_with_a_key_are_reached_through_the_router(secure: SecureCluster) -> None:
    worker = secure.cluster.worker_addresses[0]
    with Client(worker, timeout=30) as direct, pytest.raises(Unauthenticated):
        direct.generate("hello", {"max_new_tokens": 2})
    with Client(worker, api_key=WORKER_KEY, timeout=30) as direct:
        assert (
            direct.generate("hello", {"max_new_tokens": 2, "ignore_eos": True}).completion_tokens
            == 2
        )
    with Client(secure.address, api_key="key-beta", root_certificates=secure.root) as client:
        out = client.generate("hello", {"max_new_tokens": 3, "ignore_eos": True})
    assert out.completion_tokens == 3

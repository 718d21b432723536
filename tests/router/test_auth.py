"""API keys and TLS on the router, over a launched one-worker dummy:tiny cluster.

The certificate is self-signed, made here with the `openssl` CLI, for 127.0.0.1. The
launcher hands the keys to the router in its environment and checks readiness over TLS
with a key, so the cluster coming up at all already exercises both.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from radixmesh.auth import Roles, bearer_allowed
from radixmesh.client import Client
from radixmesh.cluster.cli import build_parser, router_api_keys
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.errors import Unauthenticated
from radixmesh.router.config import RouterConfig
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.router.http_helpers import Http
from tests.tls import self_signed

KEYS = ("key-alpha", "key-beta")
ADMIN = "admin-key"


# ---- without processes ------------------------------------------------------------------------


def test_bearer_allowed() -> None:
    assert bearer_allowed(None, ())  # no keys configured: open
    assert bearer_allowed("Bearer key-beta", KEYS)
    assert not bearer_allowed("Bearer key-gamma", KEYS)
    assert not bearer_allowed("key-alpha", KEYS)  # no scheme
    assert not bearer_allowed(None, KEYS)
    assert bearer_allowed("Bearer key-beta \t", KEYS)  # HTTP's optional whitespace
    for end in ("\x0b", "\r", "\x0c", "\x00"):  # gRPC passes these on: another token
        assert not bearer_allowed(f"Bearer key-beta{end}", KEYS)


def test_roles() -> None:
    alpha, admin, other = "Bearer key-alpha", f"Bearer {ADMIN}", "Bearer anything"
    with_admins = Roles(KEYS, (ADMIN,))
    assert (with_admins.admin(alpha), with_admins.reaches_all(alpha)) == (False, False)
    assert (with_admins.admin(admin), with_admins.reaches_all(admin)) == (True, True)
    assert (with_admins.operator(alpha), with_admins.operator(admin)) == (False, True)
    api_only = Roles(KEYS)  # the default: API keys see the cluster, reach only their own
    assert (api_only.admin(alpha), api_only.reaches_all(alpha)) == (True, False)
    assert api_only.operator(alpha) is False  # a client: the serving worker is not its business
    open_cluster = Roles()  # no identities: everybody reaches everything
    assert (open_cluster.admin(other), open_cluster.reaches_all(None)) == (True, True)
    assert open_cluster.operator(None) is True
    open_with_admins = Roles((), (ADMIN,))
    assert (open_with_admins.admin(other), open_with_admins.reaches_all(other)) == (False, False)
    assert "key-alpha" not in repr(with_admins) and ADMIN not in repr(with_admins)


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
        # Key checks only: these tests make many keyless calls on one connection, which
        # the router would close after 3 (tests/test_gate.py tests that).
        router_options={"http_port": http_port, "auth_failures": 100},
        api_keys=KEYS,
        admin_keys=(ADMIN,),
        tls_cert=str(cert),
        tls_key=str(key),
        ready_timeout=120.0,  # the workers' key is generated: every routed call proves it
    )  # reaches the router (and the readiness check proves the admin key works)
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
    assert anonymous.get("/metrics").status_code == 401  # the router's internals: admins'
    assert keyed.get("/metrics").status_code == 403
    metrics = Http(secure.http_port, context=secure.ssl, api_key=ADMIN).get("/metrics").text
    denied = 'endpoint="/v1/models",frontend="http",status="UNAUTHENTICATED"'
    assert f"radixmesh_router_requests_total{{{denied}}} 1.0" in metrics.splitlines()


@pytest.mark.slow
def test_workers_with_a_key_are_reached_through_the_router(secure: SecureCluster) -> None:
    worker = secure.cluster.worker_addresses[0]
    with Client(worker, timeout=30) as direct, pytest.raises(Unauthenticated):
        direct.generate("hello", {"max_new_tokens": 2})
    with Client(worker, api_key=secure.cluster.worker_key, timeout=30) as direct:
        assert (
            direct.generate("hello", {"max_new_tokens": 2, "ignore_eos": True}).completion_tokens
            == 2
        )
    with Client(secure.address, api_key="key-beta", root_certificates=secure.root) as client:
        out = client.generate("hello", {"max_new_tokens": 3, "ignore_eos": True})
    assert out.completion_tokens == 3


# ---- the auth matrix: every RPC and endpoint, with and without keys ---------------------------

NONE, WRONG, MALFORMED, API, ADMIN_KEY = "none", "wrong", "malformed", "api", "admin"
_HEADERS = {
    NONE: (),
    WRONG: (("authorization", "Bearer key-gamma"),),
    MALFORMED: (("authorization", "key-alpha"),),  # no scheme
    API: (("authorization", "Bearer key-alpha"),),
    ADMIN_KEY: (("authorization", f"Bearer {ADMIN}"),),
}
_SKY = common_pb2.Input(text="The sky is")
# Router RPCs: (name, request, admin only); Generate streams.
_ROUTER_RPCS: list[tuple[str, Any, bool]] = [
    ("Generate", GENERATE, False),
    ("Select", router_pb2.SelectRequest(input=_SKY, choices=["a", "b"]), False),
    ("Abort", router_pb2.RouterAbortRequest(request_id="x"), False),
    ("GetModelInfo", router_pb2.RouterGetModelInfoRequest(), False),
    ("ClusterStatus", router_pb2.ClusterStatusRequest(), True),
    ("FlushCache", router_pb2.RouterFlushCacheRequest(), True),
]  # fmt: skip


def _status(stub: Any, name: str, request: Any, md: Any, timeout: float = 30) -> grpc.StatusCode:
    """The status of one call (a stream read to its end)."""
    try:
        out = getattr(stub, name)(request, metadata=md, timeout=timeout)
        if name in ("Generate", "StreamCacheEvents"):
            next(iter(out), None)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def _router_expected(key: str, admin_only: bool) -> grpc.StatusCode:
    if key in (NONE, WRONG, MALFORMED):
        return grpc.StatusCode.UNAUTHENTICATED
    if admin_only and key == API:
        return grpc.StatusCode.PERMISSION_DENIED
    return grpc.StatusCode.OK


@pytest.mark.slow
@pytest.mark.parametrize("key", list(_HEADERS))
def test_router_rpcs_by_key(secure: SecureCluster, key: str) -> None:
    creds = grpc.ssl_channel_credentials(secure.root)
    with grpc.secure_channel(secure.address, creds) as ch:
        stub = router_pb2_grpc.RouterStub(ch)
        for name, request, admin_only in _ROUTER_RPCS:
            got = _status(stub, name, request, _HEADERS[key])
            assert got == _router_expected(key, admin_only), (name, key)


_TOKENS = common_pb2.Input(token_ids=common_pb2.TokenIds(ids=[104, 105]))
_BANG = worker_pb2.Continuation(text="!")
_WORKER_RPCS: list[tuple[str, Any]] = [
    ("Generate", worker_pb2.GenerateRequest(input=_TOKENS, stream=True)),
    ("Score", worker_pb2.ScoreRequest(input=_TOKENS, continuations=[_BANG])),
    ("Abort", worker_pb2.AbortRequest(request_id="x")),
    ("GetLoad", worker_pb2.GetLoadRequest()),
    ("GetCacheSnapshot", worker_pb2.GetCacheSnapshotRequest()),
    ("FlushCache", worker_pb2.FlushCacheRequest()),
    ("GetModelInfo", worker_pb2.GetModelInfoRequest()),
    ("StreamCacheEvents", worker_pb2.StreamCacheEventsRequest()),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("key", ["none", "client", "admin", "worker"])
def test_worker_rpcs_need_the_worker_key(secure: SecureCluster, key: str) -> None:
    tokens = {"client": "key-alpha", "admin": ADMIN, "worker": secure.cluster.worker_key}
    md = (("authorization", f"Bearer {tokens[key]}"),) if key in tokens else ()
    with grpc.insecure_channel(secure.cluster.worker_addresses[0]) as ch:
        stub = worker_pb2_grpc.WorkerStub(ch)
        for name, request in _WORKER_RPCS:
            timeout = 1 if name == "StreamCacheEvents" else 30
            got = _status(stub, name, request, md, timeout)
            if key != "worker":
                assert got == grpc.StatusCode.UNAUTHENTICATED, name
            else:  # the event stream stays open: its 1 s deadline passes
                assert got in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED), name


_HI = [{"role": "user", "content": "hi"}]
_HTTP = [  # (method, path, body, admin only)
    ("GET", "/v1/models", None, False),
    ("GET", "/v1/models/dummy:tiny", None, False),
    ("POST", "/v1/completions", {"model": "dummy:tiny", "prompt": "hi", "max_tokens": 1}, False),
    ("POST", "/v1/chat/completions", {"model": "dummy:tiny", "messages": _HI}, False),
    ("POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}, False),
    ("GET", "/get_model_info", None, False),
    ("GET", "/get_server_info", None, False),
    ("GET", "/health_generate", None, False),
    ("POST", "/flush_cache", None, True),
    ("POST", "/abort_request", {"rid": "x"}, False),
]  # fmt: skip


def _http(secure: SecureCluster, method: str, path: str, body: Any, auth: bytes | None) -> int:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", secure.http_port, timeout=60, context=secure.ssl
    )
    try:
        conn.putrequest(method, path)
        data = json.dumps(body).encode() if body is not None else b""
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(data)))
        if auth is not None:
            conn.putheader("Authorization", auth)
        conn.endheaders(data)
        resp = conn.getresponse()
        payload = resp.read()
        if resp.status >= 400:  # every error is JSON naming its type
            assert json.loads(payload)["error"]["type"], payload
        return resp.status
    finally:
        conn.close()


_HTTP_AUTH: dict[str, bytes | None] = {
    NONE: None,
    WRONG: b"Bearer key-gamma",
    MALFORMED: b"Bearer \xff\xfe key",  # not UTF-8
    API: b"Bearer key-beta",
    ADMIN_KEY: f"Bearer {ADMIN}".encode(),
}


@pytest.mark.slow
@pytest.mark.parametrize("key", list(_HTTP_AUTH))
def test_http_endpoints_by_key(secure: SecureCluster, key: str) -> None:
    for method, path, body, admin_only in _HTTP:
        got = _http(secure, method, path, body, _HTTP_AUTH[key])
        if key in (NONE, WRONG, MALFORMED):
            want = 401
        elif admin_only and key == API:
            want = 403
        else:
            want = 200
        assert got == want, (method, path, key)
    assert _http(secure, "GET", "/health", None, _HTTP_AUTH[key]) == 200  # open to probes
    # The metrics: an admin's here (a scraper without the key reads the metrics port).
    want = {NONE: 401, WRONG: 401, MALFORMED: 401, API: 403, ADMIN_KEY: 200}[key]
    assert _http(secure, "GET", "/metrics", None, _HTTP_AUTH[key]) == want


@pytest.mark.slow
def test_the_serving_worker_is_named_to_admins_only(secure: SecureCluster) -> None:
    body = {"model": "dummy:tiny", "prompt": "hi", "max_tokens": 2}
    user = Http(secure.http_port, context=secure.ssl, api_key="key-beta")
    admin = Http(secure.http_port, context=secure.ssl, api_key=ADMIN)
    assert "x-radixmesh-worker" not in user.post("/v1/completions", body).headers
    assert admin.post("/v1/completions", body).headers["x-radixmesh-worker"] == "worker-0"
    for caller in (user, admin):  # streams too (their headers go out before the first event)
        conn, resp = caller.open_stream("/v1/completions", {**body, "stream": True})
        try:
            worker = resp.getheader("X-Radixmesh-Worker")
            resp.read()
        finally:
            conn.close()
        assert worker == (None if caller is user else "worker-0")
    native = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
    assert user.post("/generate", native).json()["meta_info"]["worker_id"] == ""
    assert admin.post("/generate", native).json()["meta_info"]["worker_id"] == "worker-0"


@pytest.mark.slow
def test_grpc_replies_name_the_serving_worker_to_admins_only(secure: SecureCluster) -> None:
    """Generate, Resume and Embed replies carry `worker_id` for an admin key only, and a
    resumable stream's id names its worker by epoch: an API key learns no worker id."""
    creds = grpc.ssl_channel_credentials(secure.root)
    streamed = router_pb2.RouterGenerateRequest(
        input=GENERATE.input, sampling_params=GENERATE.sampling_params, stream=True
    )
    embed = router_pb2.RouterEmbedRequest(input=common_pb2.Input(text="hello"))
    with grpc.secure_channel(secure.address, creds) as ch:
        stub = router_pb2_grpc.RouterStub(ch)
        for key, want in ((API, ""), (ADMIN_KEY, "worker-0")):
            md = _HEADERS[key]
            (whole,) = list(stub.Generate(GENERATE, metadata=md, timeout=30))
            assert (whole.worker_id, whole.chunk.completion_tokens) == (want, 3)
            chunks = list(stub.Generate(streamed, metadata=md, timeout=30))
            assert [c.worker_id for c in chunks] == [want] * len(chunks)
            assert sum(len(c.chunk.token_ids) for c in chunks) == 3
            (stream_id,) = {c.stream_id for c in chunks}
            assert re.fullmatch(r"[0-9a-f]{16}/[0-9a-f]{32}", stream_id), stream_id
            assert "worker" not in stream_id
            # The finished stream is held for the grace period: resumed from the start.
            resume = router_pb2.ResumeRequest(stream_id=stream_id, offset=0)
            resumed = list(stub.Resume(resume, metadata=md, timeout=30))
            assert [c.worker_id for c in resumed] == [want] * len(resumed)
            assert [t for c in resumed for t in c.chunk.token_ids] == [
                t for c in chunks for t in c.chunk.token_ids
            ]
            assert stub.Embed(embed, metadata=md, timeout=30).worker_id == want


@pytest.mark.slow
def test_server_info_names_the_workers_to_admins_only(secure: SecureCluster) -> None:
    user = Http(secure.http_port, context=secure.ssl, api_key="key-beta").get("/get_server_info")
    admin = Http(secure.http_port, context=secure.ssl, api_key=ADMIN).get("/server_info")
    assert user.status_code == admin.status_code == 200
    assert user.json()["internal_states"] == []  # as ClusterStatus: PERMISSION_DENIED
    assert [w["worker_id"] for w in admin.json()["internal_states"]] == ["worker-0"]
    assert admin.json()["internal_states"][0]["address"] == secure.cluster.worker_addresses[0]
    # The rest is everybody's: SGLang's client reads the gRPC port from here.
    shared = {k: v for k, v in admin.json().items() if k != "internal_states"}
    assert {k: v for k, v in user.json().items() if k != "internal_states"} == shared
    assert shared["grpc_port"] == int(secure.address.rsplit(":", 1)[1])
    assert shared["model_path"] == "dummy:tiny"


@pytest.mark.slow
def test_request_ids_are_scoped_to_their_caller(secure: SecureCluster) -> None:
    params = {"max_new_tokens": 2000, "ignore_eos": True}
    with (
        Client(secure.address, api_key="key-alpha", root_certificates=secure.root) as alpha,
        Client(secure.address, api_key="key-beta", root_certificates=secure.root) as beta,
        Client(secure.address, api_key=ADMIN, root_certificates=secure.root) as admin,
    ):
        mine = alpha.generate("count", params, request_id="shared-id", stream=True)
        assert next(mine).request_id == "shared-id"
        # Another caller may use the same id at the same time, and cannot abort alpha's.
        theirs = beta.generate("count", params, request_id="shared-id", stream=True)
        assert next(theirs).request_id == "shared-id"
        assert beta.abort("shared-id") is True  # its own
        assert list(theirs)[-1].finish_reason == "abort"
        assert beta.abort("shared-id") is False  # alpha's stays out of reach
        beta_http = Http(secure.http_port, context=secure.ssl, api_key="key-beta")
        assert beta_http.post("/abort_request", {"rid": "shared-id"}).json() == {"aborted": 0}
        assert admin.abort("shared-id") is True  # an admin reaches anyone's
        assert list(mine)[-1].finish_reason == "abort"


@pytest.mark.slow
def test_keys_stay_off_command_lines_and_out_of_output(secure: SecureCluster) -> None:
    procs = [secure.cluster.router, *secure.cluster.workers]
    for proc in procs:
        assert proc is not None
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        for secret in (*KEYS, ADMIN, secure.cluster.worker_key):
            assert secret.encode() not in cmdline
    worker_env = Path(f"/proc/{secure.cluster.workers[0].pid}/environ").read_bytes()
    assert f"RADIXMESH_API_KEY={secure.cluster.worker_key}".encode() in worker_env.split(b"\0")
    metrics = Http(secure.http_port, context=secure.ssl, api_key=ADMIN).get("/metrics").text
    assert "radixmesh_router_requests_total" in metrics
    for secret in (*KEYS, ADMIN, secure.cluster.worker_key):
        assert secret not in metrics
    c = secure.cluster.config
    assert not any(k in repr(c) for k in (*KEYS, ADMIN))
    router = RouterConfig(workers=("a:1",), api_keys=KEYS, admin_keys=(ADMIN,), worker_api_key="w")
    assert not any(k in repr(router) for k in (*KEYS, ADMIN, "'w'"))
    from radixmesh.worker.server import ServerConfig

    assert "sekrit" not in repr(ServerConfig(api_key="sekrit"))

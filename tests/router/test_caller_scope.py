"""Callers cannot reach each other's requests: two API keys and no admin key (the default).

A launched one-worker dummy:tiny cluster with API keys `alpha` and `beta`, gRPC and HTTP.
Request ids are scoped to the caller's key on every API (the Abort RPC, SGLang's
`/abort_request` and `/generate`'s `rid`), and without admin keys nobody reaches another
caller's request (auth.Roles). A second router on the same workers without any key shows
the open cluster's rule: no identities, so everybody reaches every request.

Each request to abort asks for 2000 tokens (a few seconds of dummy:tiny on this machine)
and is aborted within a fraction of that, after its first chunk came back.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from radixmesh.client import Client
from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.errors import NotFound
from radixmesh.v1 import router_pb2, router_pb2_grpc
from tests.router.http_helpers import Http
from tests.router.routers import ExtraRouter

ALPHA, BETA = "key-alpha", "key-beta"
LONG = {"max_new_tokens": 2000, "ignore_eos": True}
SHORT = {"max_new_tokens": 2, "ignore_eos": True}


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    config = LaunchSpec(
        model="dummy:tiny",
        workers=1,
        port=free_port(),
        worker_args=("--dtype", "float32"),
        router_options={"http_port": free_port()},
        api_keys=(ALPHA, BETA),
        ready_timeout=120.0,
    )
    with LocalCluster(config) as cluster:
        yield cluster


def _http(cluster: LocalCluster, key: str | None) -> Http:
    return Http(int(cluster.config.router_options["http_port"]), api_key=key)


@pytest.mark.slow
def test_a_caller_reaches_only_its_own_requests(cluster: LocalCluster) -> None:
    alpha_http, beta_http = _http(cluster, ALPHA), _http(cluster, BETA)
    with (
        Client(cluster.address, api_key=ALPHA) as alpha,
        Client(cluster.address, api_key=BETA) as beta,
    ):
        mine = alpha.generate("count", LONG, request_id="job-1", stream=True)
        assert next(mine).request_id == "job-1"
        assert beta.abort("job-1") is False  # gRPC
        assert beta_http.post("/abort_request", {"rid": "job-1"}).json() == {"aborted": 0}
        assert beta_http.post("/abort_request", {"abort_all": True}).json() == {"aborted": 0}
        # The same id on /generate is beta's own request; alpha's is not disturbed.
        native = {"text": "hi", "rid": "job-1", "sampling_params": SHORT}
        out = beta_http.post("/generate", native)
        assert out.status_code == 200, out.text
        assert (out.json()["meta_info"]["id"], out.json()["meta_info"]["completion_tokens"]) == (
            "job-1",
            2,
        )
        # Alpha's request ran on through all of that; its owner reaches it.
        assert alpha_http.post("/abort_request", {"rid": "job-1"}).json() == {"aborted": 1}
        assert list(mine)[-1].finish_reason == "abort"


@pytest.mark.slow
def test_a_caller_resumes_only_its_own_streams(cluster: LocalCluster) -> None:
    """A stream's id is scoped to its key: another key's Resume finds nothing, the same
    key's follows it (here beside its first call) from the offset given."""
    with (
        Client(cluster.address, api_key=ALPHA) as alpha,
        Client(cluster.address, api_key=BETA) as beta,
    ):
        mine = alpha.generate("count", LONG, stream=True)
        first = next(mine)
        assert first.stream_id and first.offset == first.completion_tokens
        with pytest.raises(NotFound):
            list(beta.resume(first.stream_id, first.offset))
        again = alpha.resume(first.stream_id, first.offset)
        assert alpha.abort(first.request_id) is True
        rest, resumed = list(mine), list(again)
    assert rest[-1].finish_reason == resumed[-1].finish_reason == "abort"
    ids = [t for c in rest for t in c.token_ids]
    assert [t for c in resumed for t in c.token_ids] == ids  # the same log, from the offset
    assert resumed[-1].completion_tokens == first.completion_tokens + len(ids)


@pytest.mark.slow
def test_abort_all_ends_only_the_callers_requests(cluster: LocalCluster) -> None:
    with (
        Client(cluster.address, api_key=ALPHA) as alpha,
        Client(cluster.address, api_key=BETA) as beta,
    ):
        streams = [
            alpha.generate("one", LONG, request_id="a-1", stream=True),
            alpha.generate("two", LONG, request_id="a-2", stream=True),
            beta.generate("three", LONG, request_id="b-1", stream=True),
        ]
        assert [next(s).request_id for s in streams] == ["a-1", "a-2", "b-1"]
        aborted = _http(cluster, ALPHA).post("/abort_request", {"abort_all": True}).json()
        assert aborted == {"aborted": 2}
        assert beta.abort("b-1") is True  # still running: alpha's abort_all left it alone
        assert [list(s)[-1].finish_reason for s in streams] == ["abort"] * 3


@pytest.mark.slow
def test_without_admin_keys_every_api_key_sees_the_cluster(cluster: LocalCluster) -> None:
    """The other half of auth.Roles: cluster details are for admins, and without admin
    keys every API key is one (so the launcher's readiness check works with an API key)."""
    info = _http(cluster, BETA).get("/get_server_info").json()
    assert [w["worker_id"] for w in info["internal_states"]] == ["worker-0"]
    with grpc.insecure_channel(cluster.address) as channel:
        status = router_pb2_grpc.RouterStub(channel).ClusterStatus(
            router_pb2.ClusterStatusRequest(),
            metadata=(("authorization", f"Bearer {BETA}"),),
            timeout=30,
        )
    assert [w.worker_id for w in status.workers] == ["worker-0"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "rid"),
        ({"rid": 5}, "rid"),
        ({"rid": ""}, "rid"),
        ({"rid": "x" * 257}, "rid"),
        ({"rid": "x", "abort_all": True}, "rid"),
        ({"abort_all": "yes"}, "abort_all"),
        ({"rid": "x", "priority": 1}, "priority"),
        ([], "body"),
    ],
)
@pytest.mark.slow
def test_bad_abort_requests_name_the_field(cluster: LocalCluster, body: object, param: str) -> None:
    resp = _http(cluster, ALPHA).post("/abort_request", body)  # type: ignore[arg-type]
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


@pytest.mark.slow
def test_an_open_cluster_has_no_identities(cluster: LocalCluster) -> None:
    """Without any key every caller reaches every request, whatever token it sends."""
    with ExtraRouter(cluster, http=True) as open_router:
        assert open_router.http_port is not None
        with Client(open_router.address, api_key="someone") as someone:
            theirs = someone.generate("count", LONG, request_id="open-1", stream=True)
            assert next(theirs).request_id == "open-1"
            anonymous = Http(open_router.http_port)
            assert anonymous.post("/abort_request", {"rid": "open-1"}).json() == {"aborted": 1}
            assert list(theirs)[-1].finish_reason == "abort"

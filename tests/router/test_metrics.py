"""Router metrics over a launched two-worker dummy:tiny cluster: exact counter movements,
`promtool check metrics`, the same text on the metrics port and on the HTTP port.

The router polls health only every 30 s here, so a SIGKILLed worker stays "healthy" until
requests fail on it: the last test drives its circuit breaker open with retries. The
policy is round_robin, whose choices do not depend on when the summaries synced.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixmesh.cluster.launch import LocalCluster, free_port
from radixmesh.cluster.spec import LaunchSpec
from radixmesh.router.summary import BYTES_PER_BLOCK
from radixmesh.v1 import common_pb2, router_pb2, router_pb2_grpc
from tests.router.http_helpers import Http

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MODEL = "dummy:tiny"
WORKERS = ("worker-0", "worker-1")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class MetricsCluster:
    def __init__(self, cluster: LocalCluster, http_port: int, metrics_port: int) -> None:
        self.cluster = cluster
        self.http = Http(http_port)
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"

    def text(self) -> str:
        return str(urllib.request.urlopen(self.metrics_url, timeout=10).read().decode())

    def samples(self) -> Samples:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(self.text())
            for s in family.samples
        }

    def generate(self, text: str) -> router_pb2.RouterGenerateResponse:
        with grpc.insecure_channel(self.cluster.address) as ch:
            req = router_pb2.RouterGenerateRequest(
                input=common_pb2.Input(text=text),
                sampling_params=common_pb2.SamplingParams(max_new_tokens=2, temperature=0.0),
            )
            (resp,) = list(router_pb2_grpc.RouterStub(ch).Generate(req, timeout=60))
        return resp


@pytest.fixture(scope="module")
def mc() -> Iterator[MetricsCluster]:
    http_port, metrics_port = free_port(), free_port()
    config = LaunchSpec(
        model=MODEL,
        workers=2,
        policy="round_robin",
        port=free_port(),
        worker_args=("--dtype", "float32", "--event-block-size", "16"),
        router_options={
            "http_port": http_port,
            "metrics_port": metrics_port,
            "health_interval": 30.0,
            "seed": 0,
        },
        ready_timeout=120.0,
    )
    with LocalCluster(config) as cluster:
        yield MetricsCluster(cluster, http_port, metrics_port)


def _get(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _decisions(samples: Samples, worker: str) -> float:
    return _get(
        samples, "radixmesh_router_routing_decisions_total", policy="round_robin", worker=worker
    )


def test_promtool_clean_on_both_ports(mc: MetricsCluster) -> None:
    mc.generate("warm up the counters")
    text = mc.text()
    assert mc.http.get("/metrics").text.splitlines()[:3] == text.splitlines()[:3]
    local = ROOT / ".tools" / "bin" / "promtool"
    promtool = str(local) if local.exists() else shutil.which("promtool")
    assert promtool is not None, "promtool not found (`make tools` installs it)"
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout + check.stderr == ""


def test_counters_move_by_exact_amounts(mc: MetricsCluster) -> None:
    before = mc.samples()
    prompt = "exact counters over HTTP"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    usage = mc.http.post("/v1/completions", body).json()["usage"]
    assert mc.http.post("/v1/completions", {**body, "temperature": -1}).status_code == 400
    resp = mc.generate("exact counters over gRPC, twice as long")
    with grpc.insecure_channel(mc.cluster.address) as ch:
        empty = router_pb2.RouterGenerateRequest(input=common_pb2.Input(text=""))
        with pytest.raises(grpc.RpcError):
            list(router_pb2_grpc.RouterStub(ch).Generate(empty, timeout=10))
    # The router counts a refused RPC as its handler unwinds, which may be just after the
    # client has the status: read the metrics until that count is in (or 5 s pass).
    grpc_invalid = {"frontend": "grpc", "endpoint": "Generate", "status": "INVALID_ARGUMENT"}
    deadline = time.monotonic() + 5
    while True:
        after = mc.samples()
        counted = _get(after, "radixmesh_router_requests_total", **grpc_invalid)
        if counted > _get(before, "radixmesh_router_requests_total", **grpc_invalid):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)

    def moved(name: str, **labels: str) -> float:
        return _get(after, name, **labels) - _get(before, name, **labels)

    requests = "radixmesh_router_requests_total"
    http = {"frontend": "http", "endpoint": "/v1/completions"}
    assert moved(requests, **http, status="OK") == 1
    assert moved(requests, **http, status="INVALID_ARGUMENT") == 1
    assert moved(requests, frontend="grpc", endpoint="Generate", status="OK") == 1
    assert moved(requests, frontend="grpc", endpoint="Generate", status="INVALID_ARGUMENT") == 1
    # Two requests reached a worker; the invalid ones were refused before routing.
    assert sum(_decisions(after, w) - _decisions(before, w) for w in WORKERS) == 2
    assert moved("radixmesh_router_routing_decision_seconds_count") == 2
    prompt_tokens = usage["prompt_tokens"] + resp.chunk.prompt_tokens
    assert prompt_tokens == len(prompt) + len("exact counters over gRPC, twice as long")
    assert moved("radixmesh_router_prompt_tokens_total") == prompt_tokens
    cached = usage["prompt_tokens_details"]["cached_tokens"] + resp.chunk.cached_tokens
    assert moved("radixmesh_router_cached_prompt_tokens_total") == cached
    assert moved("radixmesh_router_retries_total") == 0
    # Router-side latency: the two generations that reached a worker, one count each.
    assert moved("radixmesh_router_time_to_first_token_seconds_count") == 2
    assert moved("radixmesh_router_e2e_request_latency_seconds_count") == 2
    ended = "radixmesh_router_worker_requests_total"
    assert sum(moved(ended, worker=w, status="OK") for w in WORKERS) == 2
    assert _get(after, "radixmesh_router_requests_in_flight") == 0
    blocks = 0.0
    for w in WORKERS:
        assert _get(after, "radixmesh_router_worker_breaker_state", worker=w, state="closed") == 1
        assert _get(after, "radixmesh_router_worker_breaker_state", worker=w, state="open") == 0
        assert _get(after, "radixmesh_router_worker_healthy", worker=w) == 1
        assert _get(after, "radixmesh_router_worker_requests_in_flight", worker=w) == 0
        blocks += _get(after, "radixmesh_router_prefix_index_blocks", worker=w)
    assert blocks > 0
    assert _get(after, "radixmesh_router_prefix_index_bytes") == BYTES_PER_BLOCK * blocks


def test_retries_open_the_breaker_of_a_dead_worker(mc: MetricsCluster) -> None:
    """Last in the module: it kills worker-0."""
    dead, alive = WORKERS
    proc = mc.cluster.workers[0]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = mc.samples()
    # round_robin keeps choosing the dead worker (the next health poll is 30 s away); a
    # failed attempt is retried on the other worker, and the same parity comes round
    # again. Three failures open the dead worker's breaker; from then on only the live
    # one is chosen. Five requests: exactly three retries whichever worker came first.
    for i in range(5):
        assert mc.generate(f"request {i} after the kill").worker_id == alive
    after = mc.samples()
    retries = "radixmesh_router_retries_total"
    assert _get(after, retries) - _get(before, retries) == 3
    assert _decisions(after, dead) - _decisions(before, dead) == 3
    assert _decisions(after, alive) - _decisions(before, alive) == 5
    ended = "radixmesh_router_worker_requests_total"
    assert (
        _get(after, ended, worker=dead, status="UNAVAILABLE")
        - _get(before, ended, worker=dead, status="UNAVAILABLE")
        == 3
    )
    assert (
        _get(after, ended, worker=alive, status="OK")
        - _get(before, ended, worker=alive, status="OK")
        == 5
    )
    state = "radixmesh_router_worker_breaker_state"
    assert _get(after, state, worker=dead, state="open") == 1
    assert _get(after, state, worker=dead, state="closed") == 0
    assert _get(after, "radixmesh_router_worker_healthy", worker=dead) == 0
    assert _get(after, "radixmesh_router_worker_healthy", worker=alive) == 1

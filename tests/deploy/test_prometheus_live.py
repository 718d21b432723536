"""The dashboard and the alert rules against a real Prometheus server (Debian's
`prometheus`, fetched by `make tools`) started on loopback. It scrapes a local cluster of
two dummy:tiny workers and a router every second while a short load runs through the
router (streamed and plain, shared prefixes, both front ends); then every dashboard query
and every alert expression must evaluate without error, every panel must return data,
no alert may be firing, and stopping a worker must fire RadixmeshWorkerDown for it.

The rules are deploy/prometheus/alerts.yml with every `for:` cut to 1 s (the
expressions are the shipped ones), so an alert fires within seconds, not minutes.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from radixmesh.client import Client
from radixmesh.cluster.launch import free_port, wait_router_ready
from tests.router.http_helpers import Http

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RATE_INTERVAL = "30s"  # what Grafana would put for $__rate_interval at a 1 s scrape
SCRAPE = "1s"


def _tool(name: str) -> str:
    local = ROOT / ".tools" / "bin" / name
    found = str(local) if local.exists() else shutil.which(name)
    assert found is not None, f"{name} not found (`make tools` installs it)"
    return found


@dataclass
class Live:
    prometheus: str  # base URL
    workers: list[subprocess.Popen[bytes]]
    worker_metrics: list[str]  # host:port of each worker's /metrics
    router_address: str
    http_port: int

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.prometheus}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        body = json.loads(urllib.request.urlopen(url, timeout=10).read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return list(data["result"])

    def wait_for(self, what: str, check: Any, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while (result := check()) is None:
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.5)
        return result


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "radixmesh.cluster.cli", *args]


def _prometheus_config(tmp: Path, router_metrics: str, worker_metrics: list[str]) -> Path:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    for group in rules["groups"]:
        group["interval"] = SCRAPE
        for rule in group["rules"]:
            rule["for"] = "1s"
    (tmp / "alerts.yml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
        "rule_files": ["alerts.yml"],
        "scrape_configs": [
            {"job_name": "radixmesh-router", "static_configs": [{"targets": [router_metrics]}]},
            {"job_name": "radixmesh-worker", "static_configs": [{"targets": worker_metrics}]},
        ],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("prometheus")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        workers, addresses, worker_metrics = [], [], []
        for _ in range(2):
            port, metrics = free_port(), free_port()
            # Speculating from the radix tree: a repeated request (`_load`) drafts from the
            # first one's output, so the speculative decoding panels have data.
            workers.append(subprocess.Popen(_cli(
                "worker", "--model", "dummy:tiny", "--dtype", "float32", "--host", "127.0.0.1",
                "--port", str(port), "--metrics-port", str(metrics), "--speculative", "radix",
            )))  # fmt: skip
            addresses.append(f"127.0.0.1:{port}")
            worker_metrics.append(f"127.0.0.1:{metrics}")
        procs += workers
        port, http_port, router_metrics = free_port(), free_port(), free_port()
        procs.append(subprocess.Popen(_cli(
            "router", "--workers", ",".join(addresses), "--host", "127.0.0.1",
            "--port", str(port), "--http-port", str(http_port),
            "--metrics-port", str(router_metrics), "--health-interval", "0.5",
        )))  # fmt: skip
        wait_router_ready(f"127.0.0.1:{port}", 120.0)
        config = _prometheus_config(tmp, f"127.0.0.1:{router_metrics}", worker_metrics)
        web = f"127.0.0.1:{free_port()}"
        procs.append(subprocess.Popen(
            [_tool("prometheus"), f"--config.file={config}", f"--web.listen-address={web}",
             f"--storage.tsdb.path={tmp / 'data'}", "--log.level=warn"],
            cwd=tmp, stderr=(tmp / "prometheus.log").open("w"),
        ))  # fmt: skip
        live = Live(f"http://{web}", workers, worker_metrics, f"127.0.0.1:{port}", http_port)
        live.wait_for("Prometheus to be ready", lambda: _ready(live.prometheus))
        yield live
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _ready(base: str) -> bool | None:
    try:
        return urllib.request.urlopen(f"{base}/-/ready", timeout=2).status == 200 or None
    except OSError:
        return None


def _load(live: Live) -> None:
    """~8 s of requests: 4 clients, shared prefixes (cache hits), streamed and plain,
    gRPC and HTTP, so that every histogram and counter the dashboard reads moves."""
    http = Http(live.http_port)
    stem = "A long shared system prompt that every request of this group repeats. " * 3

    def client(i: int) -> None:
        with Client(live.router_address, timeout=60) as c:
            # The same request twice: the second drafts the first's output from the tree.
            repeat = {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True}
            for _ in range(2):
                c.generate(f"Say it again, client {i}.", repeat)
            deadline = time.monotonic() + 8.0
            n = 0
            while time.monotonic() < deadline:
                prompt = f"{stem} question {i}-{n}"
                params = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}
                if n % 2:
                    list(c.generate(prompt, params, stream=True))
                else:
                    body = {"model": "dummy:tiny", "prompt": prompt, "max_tokens": 6}
                    assert http.post("/v1/completions", body).status_code == 200
                n += 1

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(client, range(4)))


def _dashboard_targets() -> list[tuple[str, str]]:
    dashboard = json.loads((DEPLOY / "grafana" / "radixmesh.json").read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", RATE_INTERVAL)
            expr = expr.replace("$model_name", ".*").replace("$instance", ".*")
            assert "$" not in expr, expr
            out.append((f"{panel['title']} {target['refId']}", expr))
    return out


def _finite(series: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in series)


def test_dashboard_queries_and_alert_expressions_evaluate_on_real_data(live: Live) -> None:
    def scraped() -> list[dict[str, Any]] | None:
        targets = live.api("targets")["activeTargets"]
        return targets if len(targets) == 3 and all(t["health"] == "up" for t in targets) else None

    targets = live.wait_for("every target to be scraped", scraped)
    assert {t["labels"]["job"] for t in targets} == {"radixmesh-router", "radixmesh-worker"}
    _load(live)
    time.sleep(3)  # a few scrapes after the last request
    empty = [where for where, expr in _dashboard_targets() if not _finite(live.query(expr))]
    assert empty == []
    # The worker series carry the served model name; the variables' query finds it.
    names = live.api("label/model_name/values")
    assert names == ["dummy:tiny"]
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            live.query(rule["expr"])  # evaluates (an error fails in `api`)
    groups = live.api("rules")["groups"]
    evaluated = [r for g in groups for r in g["rules"]]
    assert len(evaluated) == 9
    assert [(r["name"], r.get("lastError", "")) for r in evaluated if r["health"] != "ok"] == []
    assert [a["labels"]["alertname"] for a in live.api("alerts")["alerts"]] == []


def test_stopping_a_worker_fires_worker_down(live: Live) -> None:
    """Last in the module: it stops worker 1."""
    stopped = live.workers[1]
    stopped.kill()
    stopped.wait()
    instance = live.worker_metrics[1]

    def firing() -> list[dict[str, Any]] | None:
        alerts = [
            a
            for a in live.api("alerts")["alerts"]
            if a["labels"]["alertname"] == "RadixmeshWorkerDown" and a["state"] == "firing"
        ]
        return alerts or None

    (alert,) = live.wait_for("RadixmeshWorkerDown to fire", firing)
    assert alert["labels"]["instance"] == instance
    assert alert["labels"]["severity"] == "critical"
    assert re.fullmatch(rf"radixmesh worker {re.escape(instance)} does not answer scrapes",
                        alert["annotations"]["summary"])  # fmt: skip
    up = live.query('up{job="radixmesh-worker"}')
    assert sorted((s["metric"]["instance"], s["value"][1]) for s in up) == sorted(
        [(live.worker_metrics[0], "1"), (instance, "0")]
    )

"""deploy/: Helm chart, KubeRay manifests, Prometheus config and alerts, Grafana dashboard.

Everything offline: promtool (`make tools`) checks the Prometheus files and runs the
alerts' unit tests; the Helm chart is rendered and linted by Helm's own Go code
(helm-python-sdk's libhelm); kubernetes-validate checks the built-in kinds against
Kubernetes' schemas (the CRDs — RayCluster, RayJob, ServiceMonitor — by their keys);
yamllint with deploy/.yamllint.yaml. The containers' command lines are parsed by the
real `radixmesh` CLI parser, and every metric an alert or a panel queries must be one
that the worker's or the router's registry exports.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from radixmesh.cluster.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "radixmesh"
PROMETHEUS = DEPLOY / "prometheus"
K8S_VERSION = "1.30.0"
CRDS = {"RayCluster", "RayJob", "ServiceMonitor"}


def _promtool() -> str:
    local = ROOT / ".tools" / "bin" / "promtool"
    found = str(local) if local.exists() else shutil.which("promtool")
    assert found is not None, "promtool not found (`make tools` installs it)"
    return found


def _yamllint() -> str:
    return shutil.which("yamllint") or str(Path(sys.executable).parent / "yamllint")


def _run(*cmd: str, cwd: Path = ROOT) -> str:
    result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    import helm_python as helm

    chart = helm.Chart.load(str(CHART))
    files = chart.render(values, name="radixmesh", namespace="llm", is_install=True)
    docs = []
    for path, text in sorted(files.items()):
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def _by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def _container_argv(doc: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The container's command line with $(VAR) expanded as the kubelet does."""
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    argv = [*container["command"], *container["args"]]
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in argv]


def _validate(doc: dict[str, Any], version: str, strict: bool) -> None:
    """Against Kubernetes' own schemas (kubernetes-validate, imported here: the GPU test
    machine lacks it and still collects this module)."""
    import kubernetes_validate

    kubernetes_validate.validate(doc, version, strict=strict)


# ---- Prometheus ---------------------------------------------------------------------------


def test_promtool_checks_the_config_and_the_rules() -> None:
    out = _run(_promtool(), "check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert "SUCCESS: 1 rule files found" in out
    out = _run(_promtool(), "check", "rules", str(PROMETHEUS / "alerts.yml"))
    assert "SUCCESS: 9 rules found" in out


def test_alerts_fire_as_their_unit_tests_expect() -> None:
    out = _run(_promtool(), "test", "rules", "alerts_test.yml", cwd=PROMETHEUS)
    assert "SUCCESS" in out


def _worker_metric_names() -> set[str]:
    from prometheus_client.exposition import generate_latest

    from radixmesh.worker.metrics import WorkerMetrics
    from radixmesh.worker.scheduler import SchedulerStats

    stats = SchedulerStats(2, 1, 10, 100, 5, 3, 8, 4, 0, 7)
    text = generate_latest(WorkerMetrics(lambda: stats, "m").registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1] != "#"}


def _family_samples(name: str, kind: str) -> set[str]:
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "gauge": ("",),
        "summary": ("_sum", "_count", ""),
    }[kind]
    return {name + s for s in suffixes}


def _router_metric_names() -> set[str]:
    """Every series name the router's registry exports (labelled families included,
    whether or not a labelled child exists yet)."""
    from radixmesh.router.config import RouterConfig
    from radixmesh.router.metrics import RouterMetrics
    from radixmesh.router.pool import WorkerPool

    async def collect() -> set[str]:
        pool = WorkerPool(RouterConfig(workers=("127.0.0.1:1",)))
        try:
            registry = RouterMetrics(pool).registry
            return {s for f in registry.collect() for s in _family_samples(f.name, f.type)}
        finally:
            await pool.close()

    return asyncio.run(collect())


def _queried_metrics() -> dict[str, set[str]]:
    """Metric names in each alert's and each dashboard panel's expressions."""
    exprs: dict[str, str] = {}
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            exprs[f"alert {rule['alert']}"] = rule["expr"]
    dashboard = json.loads((DEPLOY / "grafana" / "radixmesh.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            exprs[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    pattern = re.compile(r"\b(radixmesh_[a-z0-9_]+|up)\b(?!\s*\()")
    return {where: set(pattern.findall(expr)) for where, expr in exprs.items()}


def test_every_queried_metric_is_exported() -> None:
    exported = _worker_metric_names() | _router_metric_names() | {"up"}
    queried = _queried_metrics()
    assert len(queried) == 9 + 54  # 9 alerts, 54 panel queries
    missing = {w: sorted(names - exported) for w, names in queried.items() if names - exported}
    assert missing == {}
    used = set().union(*queried.values())
    # Every worker family appears somewhere (a new worker metric needs a panel).
    worker_families = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in used}
    for name in _worker_metric_names():
        if not name.endswith("_created"):
            assert re.sub(r"_(total|bucket|sum|count)$", "", name) in worker_families, name


def test_dashboard_has_the_panels_and_unique_ids() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "radixmesh.json").read_text())
    panels = dashboard["panels"]
    assert [p["id"] for p in panels] == list(range(1, len(panels) + 1))
    titles = [p["title"] for p in panels if p["type"] != "row"]
    for title in (
        "Throughput (tokens/s)",
        "Time to first token",
        "Inter-token latency",
        "Prefix cache hit ratio per worker",
        "Queue depth",
        "KV cache usage",
        "Routing decisions per worker",
        "Retries",
        "Circuit breakers open",
    ):
        assert title in titles
    assert all(
        t["datasource"]["uid"] == "${datasource}" for p in panels for t in p.get("targets", [])
    )


# ---- YAML style ---------------------------------------------------------------------------


def test_yaml_files_are_yamllint_clean() -> None:
    files = [
        p
        for p in sorted(DEPLOY.rglob("*.y*ml"))
        if "templates" not in p.parts and p.name != ".yamllint.yaml"
    ]
    assert len(files) == 7
    _run(
        _yamllint(),
        "--strict",
        "-c",
        str(DEPLOY / ".yamllint.yaml"),
        *map(str, files),
    )


def test_rendered_manifests_are_yamllint_clean(tmp_path: Path) -> None:
    """The chart's output (leading blank lines aside, which Helm's own split drops; long
    lines allowed: the worker list is one string)."""
    import helm_python as helm

    values = {"serviceMonitor": {"enabled": True}, "router": {"apiKeySecret": "keys"}}
    files = helm.Chart.load(str(CHART)).render(values, name="radixmesh", namespace="llm")
    written = []
    for path, text in files.items():
        if path.endswith(".yaml"):
            written.append(tmp_path / Path(path).name)
            written[-1].write_text(text.strip() + "\n")
    assert len(written) == 4
    config = f"{{extends: {DEPLOY / '.yamllint.yaml'}, rules: {{line-length: disable}}}}"
    _run(_yamllint(), "--strict", "-d", config, *map(str, written))


# ---- Helm ---------------------------------------------------------------------------------


def test_helm_chart_lints_clean() -> None:
    import helm_python as helm

    report = helm.lint(str(CHART), strict=True, kube_version=f"v{K8S_VERSION}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_rendered_chart_validates_and_runs_real_commands() -> None:
    docs = _render()
    kinds = _by_kind(docs)
    assert sorted(kinds) == ["ConfigMap", "Deployment", "Service", "StatefulSet"]
    for doc in docs:
        _validate(doc, K8S_VERSION, strict=True)
    env = kinds["ConfigMap"][0]["data"]
    assert env["RADIXMESH_WORKERS"] == (
        "radixmesh-worker-0.radixmesh-worker.llm.svc:50051,"
        "radixmesh-worker-1.radixmesh-worker.llm.svc:50051"
    )
    parser = build_parser()
    router = parser.parse_args(_container_argv(kinds["Deployment"][0], env)[1:])
    assert (router.command, router.workers, router.port) == (
        "router",
        env["RADIXMESH_WORKERS"],
        50050,
    )
    assert (router.http_port, router.metrics_port) == (8000, 9090)
    (sts,) = kinds["StatefulSet"]
    worker = parser.parse_args(_container_argv(sts, env)[1:])
    assert (worker.command, worker.model, worker.port, worker.metrics_port) == (
        "worker",
        "smollm2",
        50051,
        9091,
    )
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    services = {s["metadata"]["name"]: s["spec"] for s in kinds["Service"]}
    assert services["radixmesh-worker"]["clusterIP"] == "None"
    assert [p["port"] for p in services["radixmesh-router"]["ports"]] == [50050, 8000, 9090]


def test_rendered_chart_with_tensor_parallel_cpu_and_service_monitors() -> None:
    values = {
        "worker": {
            "tpSize": 2,
            "replicas": 3,
            "gpu": {"enabled": False},
            "modelVolume": {"existingClaim": "llama-weights"},
        },
        "serviceMonitor": {"enabled": True},
        "router": {"apiKeySecret": "radixmesh-keys"},
    }
    kinds = _by_kind(_render(values))
    assert [m["metadata"]["name"] for m in kinds["ServiceMonitor"]] == [
        "radixmesh-router",
        "radixmesh-worker",
    ]
    for monitor in kinds["ServiceMonitor"]:
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] == "metrics"
    env = kinds["ConfigMap"][0]["data"]
    assert env["RADIXMESH_WORKERS"].count(",") == 2 and env["RADIXMESH_TP_SIZE"] == "2"
    (sts,) = kinds["StatefulSet"]
    _validate(sts, K8S_VERSION, strict=True)
    assert build_parser().parse_args(_container_argv(sts, env)[1:]).tp_size == 2
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    (router,) = kinds["Deployment"]
    _validate(router, K8S_VERSION, strict=True)
    (router_container,) = router["spec"]["template"]["spec"]["containers"]
    assert router_container["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "radixmesh-keys"
    # Both load the tokenizer from the same claim (the router read-only).
    for pod in (router["spec"]["template"]["spec"], sts["spec"]["template"]["spec"]):
        (models,) = [v for v in pod["volumes"] if v["name"] == "models"]
        assert models["persistentVolumeClaim"]["claimName"] == "llama-weights"
    assert router_container["volumeMounts"] == [
        {"name": "models", "mountPath": "/models", "readOnly": True}
    ]


# ---- KubeRay ------------------------------------------------------------------------------


def test_kuberay_manifests() -> None:
    docs = [
        d
        for name in ("raycluster.yaml", "rayjob.yaml")
        for d in yaml.safe_load_all((DEPLOY / "ray" / name).read_text())
    ]
    kinds = _by_kind(docs)
    assert sorted(kinds) == ["RayCluster", "RayJob", "Service"]
    for doc in docs:
        if doc["kind"] not in CRDS:
            _validate(doc, K8S_VERSION, strict=True)
    (cluster,) = kinds["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    (group,) = cluster["spec"]["workerGroupSpecs"]
    (container,) = group["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert group["rayStartParams"]["num-gpus"] == "1"
    head_ports = {
        p["containerPort"]
        for p in cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    }
    router_service = next(
        s for s in kinds["Service"] if s["metadata"]["name"] == "radixmesh-router"
    )
    assert {p["targetPort"] for p in router_service["spec"]["ports"]} <= head_ports
    (job,) = kinds["RayJob"]
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    argv = shlex.split(job["spec"]["entrypoint"])
    args = build_parser().parse_args(argv[1:])
    assert (argv[0], args.command, args.ray_address, args.host) == (
        "radixmesh",
        "launch",
        "auto",
        "0.0.0.0",
    )
    # One worker per GPU pod, each with /metrics on the port the pods and Service expose.
    assert (args.worker_metrics_port, args.worker_args) == (9091, "")
    (worker_service,) = [s for s in kinds["Service"] if s["metadata"]["name"] != "radixmesh-router"]
    assert [p["targetPort"] for p in worker_service["spec"]["ports"]] == [9091]
    assert [p["containerPort"] for p in container["ports"]] == [9091]


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_kuberay_custom_resources_have_their_required_keys(name: str) -> None:
    for doc in yaml.safe_load_all((DEPLOY / "ray" / name).read_text()):
        if doc["kind"] == "RayCluster":
            assert {"rayVersion", "headGroupSpec", "workerGroupSpecs"} <= set(doc["spec"])
            for group in doc["spec"]["workerGroupSpecs"]:
                assert {"groupName", "replicas", "rayStartParams", "template"} <= set(group)
        elif doc["kind"] == "RayJob":
            assert {"entrypoint", "clusterSelector"} <= set(doc["spec"])

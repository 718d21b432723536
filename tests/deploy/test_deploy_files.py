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
import base64
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from radixmesh.cluster.cli import build_parser
from tests.deploy import crds

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "radixmesh"
PROMETHEUS = DEPLOY / "prometheus"
K8S_VERSION = "1.30.0"


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
    from radixmesh.worker.stats import SchedulerStats

    stats = SchedulerStats(2, 1, 10, 100, 5, 3, 8, 4, 0, 7, spec_accept_lengths=(1, 2))
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
    assert len(queried) == 9 + 69  # 9 alerts, 69 panel queries
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
        if "templates" not in p.parts and p.name != ".yamllint.yaml" and not p.is_symlink()
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
    """The chart's output with every option on (leading blank lines aside, which Helm's
    own split drops; long lines allowed; the PrometheusRule's groups as toYaml writes
    them, sequences not indented)."""
    import helm_python as helm

    files = helm.Chart.load(str(CHART)).render(EVERYTHING, name="radixmesh", namespace="llm")
    written = []
    for path, text in files.items():
        if path.endswith(".yaml") and text.strip():  # secret.yaml: empty with a user Secret
            written.append(tmp_path / Path(path).name)
            written[-1].write_text(text.strip() + "\n")
    assert len(written) == 3
    rules = "{line-length: disable, indentation: {indent-sequences: whatever}}"
    config = f"{{extends: {DEPLOY / '.yamllint.yaml'}, rules: {rules}}}"
    _run(_yamllint(), "--strict", "-d", config, *map(str, written))


# ---- Helm ---------------------------------------------------------------------------------

EVERYTHING: dict[str, Any] = {
    "model": {
        "name": "org/model",
        "revision": "v1",
        "servedModelName": "served",
        "chatTemplate": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        "download": {"enabled": True, "tokenSecret": "hf-token"},
    },
    "router": {"apiKeySecret": "client-keys", "adminKeySecret": "admin-keys"},
    "auth": {"workerApiKeySecret": "worker-key"},
    "tls": {
        "router": {"secretName": "router-tls", "clientCASecret": "client-ca"},
        "worker": {"secretName": "worker-tls", "mutual": True, "clientSecretName": "rt-client"},
    },
    "serviceMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "grafanaDashboard": {"enabled": True, "folder": "LLM"},
}


def test_helm_chart_lints_clean() -> None:
    import helm_python as helm

    report = helm.lint(str(CHART), strict=True, kube_version=f"v{K8S_VERSION}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def _containers(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def _argv(container: dict[str, Any]) -> list[str]:
    return [*container["command"], *container["args"]][1:]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_rendered_chart_validates_and_runs_real_commands() -> None:
    docs = _render()
    kinds = _by_kind(docs)
    assert sorted(kinds) == [
        "Deployment", "PodDisruptionBudget", "Secret", "Service", "StatefulSet",
    ]  # fmt: skip
    for doc in docs:
        _validate(doc, K8S_VERSION, strict=True)
    # Workers always require a key: one the chart generates, in their environment and
    # the router's, never on a command line.
    (secret,) = kinds["Secret"]
    assert secret["metadata"]["name"] == "radixmesh-worker-key"
    assert len(base64.b64decode(secret["data"]["worker-api-key"])) == 40
    ref = {"secretKeyRef": {"name": "radixmesh-worker-key", "key": "worker-api-key"}}
    assert _env(_containers(kinds["StatefulSet"][0])["worker"])["RADIXMESH_API_KEY"] == ref
    assert _env(_containers(kinds["Deployment"][0])["router"])["RADIXMESH_WORKER_API_KEY"] == ref
    parser = build_parser()
    (router,) = kinds["Deployment"]
    router_args = parser.parse_args(_argv(_containers(router)["router"]))
    assert (router_args.command, router_args.workers, router_args.port) == (
        "router",
        "dns:radixmesh-worker.llm.svc:50051",
        50050,
    )
    assert (router_args.http_port, router_args.metrics_port) == (8000, 9090)
    (sts,) = kinds["StatefulSet"]
    worker = parser.parse_args(_argv(_containers(sts)["worker"]))
    assert (worker.command, worker.model, worker.port, worker.metrics_port) == (
        "worker",
        "smollm2",
        50051,
        9091,
    )
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["startupProbe"]["grpc"] == {"port": 50051}
    services = {s["metadata"]["name"]: s["spec"] for s in kinds["Service"]}
    assert services["radixmesh-worker"]["clusterIP"] == "None"
    # The metrics port on the headless Service only: the other may face the clients.
    assert [p["port"] for p in services["radixmesh-router"]["ports"]] == [50050, 8000]
    # Router replicas: two by default, one rollout at a time without losing one, spread
    # over nodes where possible; each pod's address on the headless router-pods Service.
    spec = router["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    (spread,) = spec["template"]["spec"]["topologySpreadConstraints"]
    assert (spread["topologyKey"], spread["whenUnsatisfiable"]) == (
        "kubernetes.io/hostname",
        "ScheduleAnyway",
    )
    pod_labels = spec["template"]["metadata"]["labels"]
    assert spread["labelSelector"]["matchLabels"] == pod_labels
    pods = services["radixmesh-router-pods"]
    assert pods["clusterIP"] == "None"
    assert pods["selector"] == services["radixmesh-router"]["selector"] == pod_labels
    assert [p["port"] for p in pods["ports"]] == [50050, 8000, 9090]
    budgets = {
        p["metadata"]["name"]: p["spec"]["maxUnavailable"] for p in kinds["PodDisruptionBudget"]
    }
    assert budgets == {"radixmesh-router": 1, "radixmesh-worker": 1}


def _notes(values: dict[str, Any]) -> str:
    import helm_python as helm

    files = helm.Chart.load(str(CHART)).render(values, name="radixmesh", namespace="llm")
    return str(next(text for path, text in files.items() if path.endswith("NOTES.txt")))


@pytest.mark.parametrize(
    ("workers", "routers", "hint"),
    [(2, 2, None), (8, 2, None), (9, 2, 3), (16, 3, 4), (16, 4, None), (3, 1, 2)],
)
def test_router_replicas_render_and_the_notes_say_how_many_the_workers_need(
    workers: int, routers: int, hint: int | None
) -> None:
    """One router replica per 4 workers, at least 2: the install notes say so when fewer
    are asked for (the Deployment has what was asked)."""
    values = {"worker": {"replicas": workers}, "router": {"replicas": routers}}
    (router,) = _by_kind(_render(values))["Deployment"]
    assert router["spec"]["replicas"] == routers
    notes = _notes(values)
    assert f"{workers} workers serving smollm2, {routers} router replicas." in notes
    if hint is None:
        assert "call for" not in notes
    else:
        assert f"{workers} workers call for {hint} router replicas" in notes
        assert f"--set router.replicas={hint}" in notes


def test_router_spread_can_be_turned_off() -> None:
    (router,) = _by_kind(_render({"router": {"spreadAcrossNodes": False}}))["Deployment"]
    assert "topologySpreadConstraints" not in router["spec"]["template"]["spec"]


def test_scaling_workers_leaves_the_router_alone() -> None:
    """The router finds workers through DNS: its Deployment does not change with
    worker.replicas, so `helm upgrade --set worker.replicas=N` restarts nothing."""
    routers = []
    for n in (2, 5):
        kinds = _by_kind(_render({"worker": {"replicas": n}}))
        (sts,) = kinds["StatefulSet"]
        assert sts["spec"]["replicas"] == n
        routers.append(kinds["Deployment"][0])
    assert routers[0] == routers[1]


def test_every_option_renders_valid_resources_and_commands() -> None:
    docs = _render(EVERYTHING)
    kinds = _by_kind(docs)
    assert sorted(kinds) == [
        "ConfigMap", "Deployment", "PodDisruptionBudget", "PrometheusRule", "Service",
        "ServiceMonitor", "StatefulSet",
    ]  # fmt: skip
    for doc in docs:
        if doc["kind"] in crds.kinds():
            crds.validate(doc)
        else:
            _validate(doc, K8S_VERSION, strict=True)
    parser = build_parser()
    (sts,) = kinds["StatefulSet"]
    w = _containers(sts)
    download = parser.parse_args(_argv(w["download-model"]))
    assert (download.command, download.model, download.revision, download.tokenizer_only) == (
        "download", "org/model", "v1", False,
    )  # fmt: skip
    assert download.download_dir == "/models/huggingface/hub"
    assert _env(w["download-model"])["HF_TOKEN"]["secretKeyRef"] == {
        "name": "hf-token", "key": "token",
    }  # fmt: skip
    worker = parser.parse_args(_argv(w["worker"]))
    assert (worker.model, worker.revision, worker.served_model_name) == (
        "org/model",
        "v1",
        "served",
    )
    assert worker.download_dir == download.download_dir
    assert worker.chat_template == "/etc/radixmesh/chat-template/template.jinja"
    tls = "/etc/radixmesh/tls/worker"
    assert (worker.tls_cert, worker.tls_key, worker.tls_client_ca) == (
        f"{tls}/tls.crt", f"{tls}/tls.key", f"{tls}/ca.crt",
    )  # fmt: skip
    env = _env(w["worker"])
    assert env["HF_HUB_OFFLINE"] == "1"
    # The worker key comes from the Secret through the environment, never argv.
    assert env["RADIXMESH_API_KEY"]["secretKeyRef"] == {
        "name": "worker-key",
        "key": "worker-api-key",
    }
    assert not any("worker-key" in a or "api-key" in a for a in _argv(w["worker"]))
    probe = parser.parse_args(w["worker"]["readinessProbe"]["exec"]["command"][1:])
    assert (probe.command, probe.address, probe.tls_ca) == (
        "health",
        "127.0.0.1:50051",
        f"{tls}/ca.crt",
    )
    assert (probe.tls_server_name, probe.tls_cert) == ("radixmesh-worker.llm.svc", f"{tls}/tls.crt")
    mounts = {m["mountPath"] for m in w["worker"]["volumeMounts"]}
    assert {tls, "/etc/radixmesh/chat-template", "/models"} <= mounts
    (router,) = kinds["Deployment"]
    r = _containers(router)
    assert parser.parse_args(_argv(r["download-model"])).tokenizer_only
    args = parser.parse_args(_argv(r["router"]))
    assert (args.tls_cert, args.tls_client_ca) == (
        "/etc/radixmesh/tls/router/tls.crt", "/etc/radixmesh/tls/client-ca/ca.crt",
    )  # fmt: skip
    assert (args.worker_tls_ca, args.worker_tls_cert, args.worker_tls_server_name) == (
        "/etc/radixmesh/tls/worker-ca/ca.crt", "/etc/radixmesh/tls/worker-client/tls.crt",
        "radixmesh-worker.llm.svc",
    )  # fmt: skip
    renv = _env(r["router"])
    assert renv["RADIXMESH_WORKER_API_KEY"]["secretKeyRef"]["name"] == "worker-key"
    assert renv["RADIXMESH_API_KEY"]["secretKeyRef"]["name"] == "client-keys"
    assert renv["RADIXMESH_ADMIN_KEY"]["secretKeyRef"] == {"name": "admin-keys", "key": "admin-key"}
    # The router sees only the workers' CA, never their private key.
    volumes = {v["name"]: v for v in router["spec"]["template"]["spec"]["volumes"]}
    assert volumes["worker-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    # ServiceMonitors: jobLabel in .spec (the CRD schema refuses it under endpoints).
    for monitor in kinds["ServiceMonitor"]:
        assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/component"
    # Each selects one Service (the router's: router-pods alone, the one with the metrics
    # port, or every router pod would be scraped twice).
    services = {"router": "radixmesh-router-pods", "worker": "radixmesh-worker"}
    for monitor in kinds["ServiceMonitor"]:
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        chosen = [s for s in kinds["Service"] if wanted <= s["metadata"]["labels"].items()]
        component = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
        assert [s["metadata"]["name"] for s in chosen] == [services[component]]
        ports = {p["name"] for s in chosen for p in s["spec"]["ports"]}
        assert monitor["spec"]["endpoints"][0]["port"] in ports
    (rule,) = kinds["PrometheusRule"]
    alerts = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]
    maps = {m["metadata"]["name"]: m for m in kinds["ConfigMap"]}
    dashboard = maps["radixmesh-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["radixmesh.json"]) == json.loads(
        (DEPLOY / "grafana" / "radixmesh.json").read_text()
    )
    template = maps["radixmesh-chat-template"]["data"]["template.jinja"]
    assert template == EVERYTHING["model"]["chatTemplate"]


def test_a_misplaced_field_fails_the_crd_schema() -> None:
    (monitor, _) = _by_kind(_render(EVERYTHING))["ServiceMonitor"]
    monitor["spec"]["endpoints"][0]["jobLabel"] = monitor["spec"].pop("jobLabel")
    with pytest.raises(jsonschema.ValidationError, match="'jobLabel' was unexpected"):
        crds.validate(monitor)


def test_values_schema_refuses_bad_values() -> None:
    import helm_python as helm

    cases: list[dict[str, Any]] = [
        {"worker": {"tpSize": 0}},
        {"router": {"policy": "fastest"}},
        {"modle": {}},
    ]
    for bad in cases:
        with pytest.raises(helm.errors.HelmValuesError):
            _render(bad)


def test_chart_readme_lists_every_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    leaves = []

    def walk(node: Any, path: list[str]) -> None:
        opaque = path[-1:] in (["resources"], ["nodeSelector"], ["affinity"], ["labels"])
        if isinstance(node, dict) and node and not opaque:
            for key, value in node.items():
                walk(value, [*path, key])
        else:
            leaves.append(".".join(path))

    walk(values, [])
    listed = re.findall(r"^\| `([\w.]+)` \|", (CHART / "README.md").read_text(), re.M)
    assert listed == leaves


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
        if doc["kind"] not in crds.kinds():
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
    # One worker per GPU pod, each with /metrics on the port the pods and Service expose;
    # spread over the pods by one placement group (a lost pod's workers placed again).
    assert (args.worker_metrics_port, args.worker_args) == (9091, ())
    assert args.worker_placement == "spread"
    # Two routers on the head: one port each for their metrics (9090 and the next), on
    # the head pod and the router Service.
    assert (args.routers, args.metrics_port) == (2, 9090)
    router_metrics = {9090, 9091}
    assert router_metrics <= head_ports
    assert router_metrics <= {p["targetPort"] for p in router_service["spec"]["ports"]}
    (worker_service,) = [s for s in kinds["Service"] if s["metadata"]["name"] != "radixmesh-router"]
    assert [p["targetPort"] for p in worker_service["spec"]["ports"]] == [9091]
    assert [p["containerPort"] for p in container["ports"]] == [9091]


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_kuberay_custom_resources_match_their_crds(name: str) -> None:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "ray" / name).read_text())]
    custom = [d for d in docs if d["kind"] in crds.kinds()]
    assert custom
    for doc in custom:
        crds.validate(doc)
    for doc in docs:
        if doc["kind"] == "RayCluster":
            assert doc["spec"]["enableInTreeAutoscaling"] is True
            (group,) = doc["spec"]["workerGroupSpecs"]
            assert (group["minReplicas"], group["replicas"]) == (0, 0)

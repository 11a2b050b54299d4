"""deploy/k8s/: each overlay renders with `kubectl kustomize`, every object validates against
the Kubernetes schemas (kubernetes-validate, offline), the Prometheus Operator objects are
checked by structure and against deploy/prometheus/, and each Deployment's command, ports,
probes and environment agree with the services' own flags (kvledger/flags.py) and with the
same service in docker-compose.yml."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kvledger.config.worker import CPU_KV_CACHE_BYTES
from kvledger.flag_values import env_default
from kvledger.flags import DEFAULT_METRICS_PORT, FRONTEND, SCHEDULER, WORKER, flags_for
from tests.deploy.k8s import (
    CRD_KINDS,
    KUBERNETES_VERSIONS,
    OVERLAYS,
    PROMETHEUS_RULE,
    SCHEDULER_DEPLOYMENT,
    SECRET,
    TLS_OVERLAYS,
    alert_groups,
    container,
    env_entries,
    env_values,
    named_port,
    objects,
    prometheus_rule,
    prometheus_rule_text,
    render,
    service_of,
)
from tests.deploy.tools import REPO

NON_FLAG_ENV = {"KVLEDGER_CACHE_DIR"}  # the model cache directory (kvledger/models.py)
# Defaults that a flag defaulting to None stands for on a CPU worker (kvledger/config/worker.py).
EFFECTIVE_DEFAULT = {"KVLEDGER_KV_CACHE_MEMORY_BYTES": CPU_KV_CACHE_BYTES}
# Set even where they equal the default: the ports are those the containerPorts, Services and
# probes name, and the model is the one the frontend's KVLEDGER_REQUIRE_MODEL waits for.
PINNED = {
    "KVLEDGER_PORT",
    "KVLEDGER_GRPC_PORT",
    "KVLEDGER_METRICS_PORT",
    "KVLEDGER_MODEL",
    "KVLEDGER_SERVED_MODEL_NAME",
}
IMAGE_UID = 1000  # the user `kvledger` of both Dockerfiles

FRONTEND_DEPLOYMENT = "kvledger-frontend"
DEPLOYMENTS = {
    SCHEDULER_DEPLOYMENT,
    "kvledger-worker",
    "kvledger-embedding-worker",
    FRONTEND_DEPLOYMENT,
}
# Each Deployment's twin in docker-compose.yml, per overlay.
COMPOSE_TWIN = {
    "cpu": {
        SCHEDULER_DEPLOYMENT: "scheduler",
        "kvledger-worker": "worker",
        "kvledger-embedding-worker": "embedding-worker",
        FRONTEND_DEPLOYMENT: "frontend",
    },
    "gpu": {
        SCHEDULER_DEPLOYMENT: "scheduler",
        "kvledger-worker": "worker-gpu",
        "kvledger-embedding-worker": "embedding-worker",
        FRONTEND_DEPLOYMENT: "frontend",
    },
}
COMPOSE_TWIN["cpu-tls"] = COMPOSE_TWIN["cpu"]
# Where Kubernetes differs from compose on purpose: JSON logs for the cluster's log stack
# (added); the API key is required (a Secret; optional in compose); the scheduler's address is
# its Service, a worker's id its pod's name (compose's CPU worker sets none: each replica of
# `--scale` names itself), and every worker pod has its own IP, so the CUDA worker keeps the
# workers' metrics port (compose gives it 9403 beside the others on one host).
K8S_ONLY_ENV = {"KVLEDGER_LOG_FORMAT"}
DIFFERENT_VALUE = {
    "KVLEDGER_SCHEDULER",
    "KVLEDGER_WORKER_ID",
    "KVLEDGER_METRICS_PORT",
    "KVLEDGER_API_KEY",
}
# The component grpc-tls adds these (compose stays plaintext); only in its overlays.
TLS_ENV = {"KVLEDGER_GRPC_TLS_CERT", "KVLEDGER_GRPC_TLS_KEY", "KVLEDGER_GRPC_TLS_CA"}
# The frontend's keys must be set: a cluster Service is reachable by every pod of the cluster.
REQUIRED_SECRETS = {
    SCHEDULER: {"KVLEDGER_WORKER_AUTH_TOKEN", "KVLEDGER_FRONTEND_AUTH_TOKEN"},
    WORKER: {"KVLEDGER_WORKER_AUTH_TOKEN"},
    FRONTEND: {"KVLEDGER_FRONTEND_AUTH_TOKEN", "KVLEDGER_API_KEY"},
}
COMPOSE_VAR = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")


# ---- helpers over the rendered objects


def deployments(overlay: str) -> dict[str, dict[str, Any]]:
    return objects(overlay, "Deployment")


def metrics_port(deployment: dict[str, Any]) -> int:
    value = env_values(deployment).get("KVLEDGER_METRICS_PORT")
    if value is None:
        return DEFAULT_METRICS_PORT[service_of(deployment)]
    return int(value)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def services_of(overlay: str, deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        s
        for s in objects(overlay, "Service").values()
        if selects(s["spec"]["selector"], pod_labels(deployment))
    ]


def service_target(deployment: dict[str, Any], svc: dict[str, Any], port_name: str) -> int:
    [port] = [p for p in svc["spec"]["ports"] if p["name"] == port_name]
    return named_port(deployment, port.get("targetPort", port["port"]))


def compose_services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]


def compose_env(name: str) -> dict[str, str]:
    """A compose service's environment with `${VAR:-default}` read as its default; a required
    `${VAR:?...}` (the secrets) as None."""
    out = {}
    for key, raw in compose_services()[name]["environment"].items():
        match = COMPOSE_VAR.fullmatch(str(raw))
        if match is not None and match.group(2) == "?":
            out[key] = None
        else:
            out[key] = COMPOSE_VAR.sub(lambda m: m.group(3) or "", str(raw))
    return out


# ---- rendering and schemas


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_the_whole_stack(overlay):
    kinds = {(o["kind"], o["metadata"]["name"]) for o in render(overlay)}
    assert set(deployments(overlay)) == DEPLOYMENTS
    assert {n for k, n in kinds if k == "Service"} == DEPLOYMENTS
    assert {("HorizontalPodAutoscaler", FRONTEND_DEPLOYMENT)} <= kinds
    assert {("PodDisruptionBudget", FRONTEND_DEPLOYMENT)} <= kinds
    assert {("PersistentVolumeClaim", "kvledger-models")} <= kinds
    assert {("ServiceMonitor", "kvledger"), ("PrometheusRule", "kvledger")} <= kinds
    assert "Secret" not in {k for k, _ in kinds}, "secrets are the operator's, never committed"
    namespaces = {o["metadata"].get("namespace") for o in render(overlay)}
    assert namespaces == {"kvledger"}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_against_the_kubernetes_schemas(overlay, version):
    checked = 0
    for obj in render(overlay):
        if obj["kind"] in CRD_KINDS:
            continue  # no schema in kubernetes-validate: checked below by structure
        try:
            # strict: a misspelt or misplaced field is an error, not silently dropped
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} ({version}): {err.message}")
        checked += 1
    assert checked == len(render(overlay)) - len(CRD_KINDS)


# ---- commands, environment and secrets against the flags and compose


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_environment_is_made_of_the_services_own_flags(overlay):
    for name, dep in deployments(overlay).items():
        service = service_of(dep)
        flags = {f.env_var: f for f in flags_for(service)}
        c = container(dep)
        assert not c.get("args"), f"{name}: put flags in KVLEDGER_* variables, not the command"
        assert not c.get("envFrom"), f"{name}: every variable is named, so it can be checked"
        for key, entry in env_entries(dep).items():
            if not key.startswith("KVLEDGER_") or key in NON_FLAG_ENV:
                continue
            assert key in flags, f"{name}: {key} is no flag of the {service}"
            if flags[key].secret:
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                assert ref and ref["name"] == SECRET, f"{name}: {key} must come from {SECRET}"
                assert not ref.get("optional"), f"{name}: {key} is required"
            elif key == "KVLEDGER_WORKER_ID":
                assert entry["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
            else:
                assert isinstance(entry.get("value"), str), f"{name}: {key} is a plain value"
        secret_vars = {k for k, e in env_entries(dep).items() if "valueFrom" in e} - {
            "KVLEDGER_WORKER_ID"
        }
        assert secret_vars == REQUIRED_SECRETS[service], name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_secret_is_one_key_shared_by_every_service_that_needs_it(overlay):
    keys: dict[str, set[str]] = {}
    for dep in deployments(overlay).values():
        for key, entry in env_entries(dep).items():
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                keys.setdefault(key, set()).add(ref["key"])
    assert keys == {
        "KVLEDGER_WORKER_AUTH_TOKEN": {"worker-auth-token"},
        "KVLEDGER_FRONTEND_AUTH_TOKEN": {"frontend-auth-token"},
        "KVLEDGER_API_KEY": {"api-keys"},
    }
    docs = (REPO / "docs" / "operations.md").read_text()
    for key in ("worker-auth-token", "frontend-auth-token", "api-keys"):
        assert f"--from-literal={key}=" in docs, f"operations.md: how to create {SECRET}/{key}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_same_shape_as_docker_compose(overlay):
    for name, twin in COMPOSE_TWIN[overlay].items():
        dep = deployments(overlay)[name]
        ours = {k for k in env_entries(dep) if k.startswith("KVLEDGER_")}
        theirs = compose_env(twin)
        k8s_only = K8S_ONLY_ENV | (TLS_ENV if overlay in TLS_OVERLAYS else set())
        k8s_only |= {"KVLEDGER_WORKER_ID"} - set(theirs)
        assert compose_services()[twin]["command"] == container(dep)["command"], name
        # compose may restate a default that the manifests leave out
        restated = {k for k, v in theirs.items() if k not in PINNED and _is_default(dep, k, v)}
        assert set(theirs) - restated <= ours - k8s_only <= set(theirs), f"{name} vs {twin}"
        values = env_values(dep)
        for key, value in theirs.items():
            if value is None:  # required in compose: a secret
                assert key not in values, f"{name}: {key} comes from the Secret"
            elif key not in DIFFERENT_VALUE and key in values:
                assert values[key] == value, f"{name}: {key} differs from compose {twin}"


def _is_default(dep: dict, key: str, value: str | None) -> bool:
    """The variable's value is what its flag gives anyway (read as the flag reads it)."""
    flag = {f.env_var: f for f in flags_for(service_of(dep))}.get(key)
    if flag is None or value is None:
        return False
    return env_default(flag, {key: value}) == EFFECTIVE_DEFAULT.get(key, flag.default)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_variable_restates_its_flags_default(overlay):
    """Set only what differs from the default, so that a changed default is not silently
    pinned here; PINNED says which values other objects of the manifests depend on."""
    for name, dep in deployments(overlay).items():
        restated = [
            key
            for key, value in env_values(dep).items()
            if key not in PINNED and _is_default(dep, key, value)
        ]
        assert restated == [], f"{name} restates the default of {restated}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_addresses_ports_probes_and_services_agree(overlay):
    deps = deployments(overlay)
    sched = deps[SCHEDULER_DEPLOYMENT]
    sched_env = env_values(sched)
    assert sched_env["KVLEDGER_GRPC_HOST"] == "0.0.0.0", "the scheduler must bind beyond loopback"
    grpc_port = int(sched_env["KVLEDGER_GRPC_PORT"])
    assert named_port(sched, "grpc") == grpc_port
    c = container(sched)
    for probe in ("readinessProbe", "livenessProbe"):
        if overlay in TLS_OVERLAYS:  # the kubelet's grpc probe cannot do (mutual) TLS
            assert "grpc" not in c[probe], f"scheduler {probe}: plaintext, refused by mTLS"
            tcp = c[probe]["tcpSocket"]["port"]
            assert named_port(sched, tcp) == grpc_port, f"scheduler {probe}: the gRPC port"
        else:
            assert c[probe]["grpc"]["port"] == grpc_port, f"scheduler {probe}: grpc.health.v1"
    [sched_svc] = services_of(overlay, sched)
    assert service_target(sched, sched_svc, "grpc") == grpc_port
    [grpc_svc_port] = [p["port"] for p in sched_svc["spec"]["ports"] if p["name"] == "grpc"]
    scheduler_address = f"{sched_svc['metadata']['name']}:{grpc_svc_port}"

    for name, dep in deps.items():
        service, env, c = service_of(dep), env_values(dep), container(dep)
        assert env["KVLEDGER_METRICS_HOST"] == "0.0.0.0", f"{name}: Prometheus scrapes the pod"
        assert named_port(dep, "metrics") == metrics_port(dep), name
        [svc] = services_of(overlay, dep)
        assert service_target(dep, svc, "metrics") == metrics_port(dep), name
        for port in svc["spec"]["ports"]:
            named_port(dep, port.get("targetPort", port["port"]))  # a port the pod has
        if service in (FRONTEND, WORKER):
            assert env["KVLEDGER_SCHEDULER"] == scheduler_address, name
        if service == FRONTEND:
            assert env["KVLEDGER_HOST"] == "0.0.0.0"
            http = int(env["KVLEDGER_PORT"])
            assert named_port(dep, "http") == http
            ready = c["readinessProbe"]["httpGet"]
            assert (ready["path"], named_port(dep, ready["port"])) == ("/health", http)
            live = c["livenessProbe"]["httpGet"]
            assert named_port(dep, live["port"]) == http
            assert service_target(dep, svc, "http") == http
        if service == WORKER:
            assert svc["spec"].get("clusterIP") == "None", f"{name}: headless, one pod each"
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                get = c[probe]["httpGet"]
                assert (get["path"], named_port(dep, get["port"])) == (
                    "/metrics",
                    metrics_port(dep),
                ), f"{name} {probe}: the metrics endpoint answers once the model is loaded"


def test_metrics_ports_match_compose_and_the_defaults():
    deps = deployments("cpu")
    assert metrics_port(deps[SCHEDULER_DEPLOYMENT]) == DEFAULT_METRICS_PORT[SCHEDULER]
    assert metrics_port(deps["kvledger-worker"]) == DEFAULT_METRICS_PORT[WORKER]
    for name, twin in COMPOSE_TWIN["cpu"].items():
        assert str(metrics_port(deps[name])) == compose_env(twin)["KVLEDGER_METRICS_PORT"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_frontend_requires_exactly_the_workers_models(overlay):
    deps = deployments(overlay)
    served = {
        env_values(d).get("KVLEDGER_SERVED_MODEL_NAME") or env_values(d)["KVLEDGER_MODEL"]
        for d in deps.values()
        if service_of(d) == WORKER
    }
    assert "all-MiniLM-L6-v2" in served
    required = env_values(deps[FRONTEND_DEPLOYMENT])["KVLEDGER_REQUIRE_MODEL"]
    assert set(required.replace(",", " ").split()) == served


# ---- replicas, scaling, disruption, security, storage


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_scheduler_and_at_least_two_autoscaled_frontends(overlay):
    deps = deployments(overlay)
    sched = deps[SCHEDULER_DEPLOYMENT]["spec"]
    assert sched["replicas"] == 1, "one ledger"
    assert sched["strategy"]["type"] == "Recreate", "never two schedulers, even mid-upgrade"
    front = deps[FRONTEND_DEPLOYMENT]
    assert front["spec"]["replicas"] >= 2
    [hpa] = objects(overlay, "HorizontalPodAutoscaler").values()
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": FRONTEND_DEPLOYMENT,
    }
    assert 2 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    [pdb] = objects(overlay, "PodDisruptionBudget").values()
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(front))
    assert 1 <= pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]
    for name, dep in deps.items():
        spec_selector = dep["spec"]["selector"]["matchLabels"]
        matching = [d for d in deps.values() if selects(spec_selector, pod_labels(d))]
        assert matching == [dep], f"{name}: its selector picks only its own pods"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_as_non_root_with_requests_and_limits(overlay):
    for name, dep in deployments(overlay).items():
        pod = dep["spec"]["template"]["spec"]
        sc = pod["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == IMAGE_UID, name
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert pod.get("automountServiceAccountToken") is False, name
        c = container(dep)
        csc = c["securityContext"]
        assert csc["allowPrivilegeEscalation"] is False, name
        assert csc["capabilities"]["drop"] == ["ALL"], name
        assert csc["readOnlyRootFilesystem"] is True, name
        assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"]), f"{name}: a /tmp"
        res = c["resources"]
        assert {"cpu", "memory"} <= set(res["requests"]), name
        assert {"cpu", "memory"} <= set(res["limits"]), name
    for dockerfile in ("Dockerfile.cpu", "Dockerfile.cuda"):
        text = (REPO / "deploy" / dockerfile).read_text()
        assert f"--uid {IMAGE_UID} kvledger" in text and "USER kvledger" in text, dockerfile


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_models_come_from_the_persistent_volume_claim(overlay):
    claims = objects(overlay, "PersistentVolumeClaim")
    for name, dep in deployments(overlay).items():
        pod = dep["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        mounts = {m["mountPath"]: m for m in container(dep).get("volumeMounts", [])}
        if service_of(dep) == SCHEDULER:
            assert "/models" not in mounts, "the scheduler never reads a model"
            continue
        mount = mounts["/models"]
        claim = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
        assert claim in claims, name
        if service_of(dep) == FRONTEND:
            assert mount.get("readOnly") is True, "the frontend only reads tokenizers"
        else:
            assert not mount.get("readOnly"), f"{name} writes the model cache"
            assert pod["securityContext"]["fsGroup"] == IMAGE_UID, name
    [claim] = claims.values()
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "pods on several nodes share it"


def _gpus(dep: dict[str, Any]) -> dict[str, Any]:
    res = container(dep)["resources"]
    return {k: res.get(k, {}).get("nvidia.com/gpu") for k in ("requests", "limits")}


def test_gpu_overlay_runs_generative_workers_on_the_cuda_image_with_a_gpu():
    deps = deployments("gpu")
    worker = deps["kvledger-worker"]
    assert container(worker)["image"].split(":")[0].endswith("kvledger-cuda")
    assert _gpus(worker) == {"requests": 1, "limits": 1}
    env = env_values(worker)
    assert env["KVLEDGER_DEVICE"] == "cuda"
    assert int(env["KVLEDGER_BLOCK_SIZE"]) % 256 == 0, "flash-attn's paged KV"
    assert "KVLEDGER_KV_CACHE_MEMORY_BYTES" not in env, "on CUDA the GPU memory share decides"
    for name, dep in deps.items():
        if name != "kvledger-worker":
            assert _gpus(dep) == {"requests": None, "limits": None}, name
            assert "kvledger-cpu" in container(dep)["image"], name


@pytest.mark.parametrize("overlay", ["cpu", "cpu-tls"])
def test_cpu_overlay_asks_for_no_gpu(overlay):
    for name, dep in deployments(overlay).items():
        assert _gpus(dep) == {"requests": None, "limits": None}, name
        assert "kvledger-cpu" in container(dep)["image"], name
        assert env_values(dep).get("KVLEDGER_DEVICE", "cpu") == "cpu", name


# ---- the Prometheus Operator's objects (custom resources: no schema to validate against)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor_scrapes_every_services_metrics_port(overlay):
    [sm] = objects(overlay, "ServiceMonitor").values()
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    selector = sm["spec"]["selector"]["matchLabels"]
    [endpoint] = sm["spec"]["endpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}
    assert endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+s", endpoint["interval"])
    selected = {
        n: s
        for n, s in objects(overlay, "Service").items()
        if selects(selector, s["metadata"]["labels"])
    }
    for name, dep in deployments(overlay).items():
        [svc] = services_of(overlay, dep)
        assert svc["metadata"]["name"] in selected, f"{name} is not scraped"
        assert service_target(dep, svc, endpoint["port"]) == metrics_port(dep), name


def test_prometheus_rule_is_generated_from_the_alert_rules():
    assert PROMETHEUS_RULE.read_text() == prometheus_rule_text(), (
        f"{PROMETHEUS_RULE.relative_to(REPO)} is stale: run `python -m tests.deploy.k8s`"
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_prometheus_rule_carries_exactly_the_alert_rules(overlay):
    [rule] = objects(overlay, "PrometheusRule").values()
    expected = prometheus_rule()
    assert (rule["apiVersion"], rule["kind"]) == (expected["apiVersion"], expected["kind"])
    assert set(rule["spec"]) == {"groups"}
    assert rule["spec"]["groups"] == alert_groups()
    for group in rule["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"}
        for r in group["rules"]:
            assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, r
            assert r["alert"] and r["expr"] and r["labels"]["severity"], r

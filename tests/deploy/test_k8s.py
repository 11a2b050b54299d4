"""deploy/k8s/: each overlay renders with `kubectl kustomize`, every object validates against
the Kubernetes schemas (kubernetes-validate, offline), and each Deployment's command, ports,
probes, secrets, resources and environment agree with the services' own flags
(kvledger/flags.py). Against docker-compose.yml: test_k8s_compose.py; the Prometheus Operator
objects: test_k8s_monitoring.py."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from kvledger.flags import FRONTEND, SCHEDULER, WORKER, flags_for
from tests.deploy.k8s import (
    CRD_KINDS,
    FRONTEND_DEPLOYMENT,
    KUBERNETES_VERSIONS,
    OVERLAYS,
    SCHEDULER_DEPLOYMENT,
    SECRET,
    TLS_OVERLAYS,
    container,
    deployments,
    env_entries,
    env_values,
    metrics_port,
    named_port,
    objects,
    pod_labels,
    render,
    selects,
    service_of,
    service_target,
    services_of,
)
from tests.deploy.tools import REPO
from worker.device_defaults import choose

NON_FLAG_ENV = {"KVLEDGER_CACHE_DIR"}  # the model cache directory (kvledger/models.py)
IMAGE_UID = 1000  # the user `kvledger` of both Dockerfiles

DEPLOYMENTS = {
    SCHEDULER_DEPLOYMENT,
    "kvledger-worker",
    "kvledger-embedding-worker",
    FRONTEND_DEPLOYMENT,
}
# The frontend's keys must be set: a cluster Service is reachable by every pod of the cluster.
REQUIRED_SECRETS = {
    SCHEDULER: {"KVLEDGER_WORKER_AUTH_TOKEN", "KVLEDGER_FRONTEND_AUTH_TOKEN"},
    WORKER: {"KVLEDGER_WORKER_AUTH_TOKEN"},
    FRONTEND: {"KVLEDGER_FRONTEND_AUTH_TOKEN", "KVLEDGER_API_KEY"},
}


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


# ---- commands, environment and secrets against the flags


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
    block_size = env.get("KVLEDGER_BLOCK_SIZE")
    chosen = choose("cuda", env.get("KVLEDGER_DTYPE"), block_size and int(block_size), "auto", True)
    assert (chosen.attention, chosen.block_size % 256) == ("flash_attn", 0), chosen.reason
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

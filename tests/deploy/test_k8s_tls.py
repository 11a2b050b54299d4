"""deploy/k8s/components/grpc-tls: mutual TLS on every gRPC link. Each Deployment of an overlay
with the component (overlays/cpu-tls) points KVLEDGER_GRPC_TLS_CERT/_KEY/_CA, flags of its
service, at files of its role's Secret mounted read-only; the component changes nothing else
but the scheduler's probes; it composes with the gpu overlay too; no key or certificate is
committed; the cert-manager example issues exactly the Secrets mounted, with the names clients
dial. The rendering and schema checks of tests/deploy/test_k8s.py run on cpu-tls as well."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kvledger.flags import FRONTEND, SCHEDULER, WORKER, flags_for
from tests.deploy.k8s import (
    GRPC_TLS,
    K8S,
    KUBERNETES_VERSIONS,
    OVERLAYS,
    SCHEDULER_DEPLOYMENT,
    TLS_OVERLAYS,
    container,
    env_entries,
    env_values,
    kubectl,
    named_port,
    render,
    service_of,
)
from tests.deploy.tools import REPO, run

TLS_OVERLAY = "cpu-tls"
PLAIN_TWIN = "cpu"  # cpu-tls is this overlay plus the component, nothing else
# Each flag's file in a kubernetes.io/tls Secret as cert-manager issues it.
TLS_FILES = {
    "KVLEDGER_GRPC_TLS_CERT": "tls.crt",
    "KVLEDGER_GRPC_TLS_KEY": "tls.key",
    "KVLEDGER_GRPC_TLS_CA": "ca.crt",
}
# The Secret each Deployment mounts: one per role.
ROLE_SECRET = {
    "kvledger-scheduler": "kvledger-grpc-tls-scheduler",
    "kvledger-frontend": "kvledger-grpc-tls-frontend",
    "kvledger-worker": "kvledger-grpc-tls-worker",
    "kvledger-embedding-worker": "kvledger-grpc-tls-worker",
}
CERT_MANAGER = GRPC_TLS / "cert-manager.yaml"
# What a committed key or certificate would look like.
PEM_MARKERS = ("-----BEGIN", "PRIVATE KEY", "MII")


def tls_volume(dep: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The mount holding `path`, its volume, and the file's name within the mount."""
    mounts = [
        m
        for m in container(dep).get("volumeMounts", [])
        if path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    name = dep["metadata"]["name"]
    assert len(mounts) == 1, f"{name}: {path} lies under {len(mounts)} mounts, not one"
    [mount] = mounts
    assert "subPath" not in mount, f"{name}: a subPath mount never sees a renewed Secret"
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    return mount, volumes[mount["name"]], path[len(mount["mountPath"].rstrip("/")) + 1 :]


def without_tls(dep: dict[str, Any]) -> dict[str, Any]:
    """A Deployment with the component's changes taken out again (all but the probes)."""
    dep = copy.deepcopy(dep)
    pod = dep["spec"]["template"]["spec"]
    [c] = pod["containers"]
    tls_volumes = {v["name"] for v in pod["volumes"] if "secret" in v}
    c["env"] = [e for e in c["env"] if e["name"] not in TLS_FILES]
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] not in tls_volumes]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] not in tls_volumes]
    return dep


def render_with_component(tmp_path: Path, overlay: str) -> list[dict[str, Any]]:
    """An operator's overlay: `overlay` plus the component (kustomize wants relative paths)."""
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(K8S / "overlays" / overlay, tmp_path)],
                "components": [os.path.relpath(GRPC_TLS, tmp_path)],
            }
        )
    )
    proc = run([kubectl(), "kustomize", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def certificates() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(CERT_MANAGER.read_text()) if d]
    assert {d["apiVersion"] for d in docs} == {"cert-manager.io/v1"}
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}


def issuers() -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(CERT_MANAGER.read_text()) if d]
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Issuer"}


def deployments_of(objs: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}


def assert_mutual_tls(deps: dict[str, dict[str, Any]]) -> None:
    assert set(deps) == set(ROLE_SECRET)
    for name, dep in deps.items():
        service = service_of(dep)
        flags = {f.env_var: f for f in flags_for(service)}
        entries = env_entries(dep)
        for var, key in TLS_FILES.items():
            assert var in flags, f"{name}: {var} is no flag of the {service}"
            assert not flags[var].secret, f"{var} names a file; the Secret holds the contents"
            entry = entries.get(var)
            assert entry is not None, f"{name}: {var} unset: mutual TLS needs all three"
            assert set(entry) == {"name", "value"}, f"{name}: {var} is a path, not a secret ref"
            mount, volume, file = tls_volume(dep, entry["value"])
            assert mount.get("readOnly") is True, f"{name}: mount {mount['name']} is read-only"
            secret = volume.get("secret")
            assert secret, f"{name}: {entry['value']} is not on a Secret volume"
            assert secret["secretName"] == ROLE_SECRET[name], name
            assert not secret.get("optional"), f"{name}: without its Secret it must not start"
            # The file is the Secret's key of that name. With an `items` list only the listed
            # paths exist, each from the key it names.
            if "items" in secret:
                items = {i["path"]: i["key"] for i in secret["items"]}
                assert items.get(file) == key, f"{name}: {var} reads {file}, not key {key}"
            else:
                assert file == key, f"{name}: {var} reads {file}, not key {key}"
            # Readable by the container's user (the files are root's, group fsGroup if any).
            mode = next(
                (i["mode"] for i in secret.get("items", []) if i["path"] == file and "mode" in i),
                secret.get("defaultMode", 0o644),
            )
            fs_group = dep["spec"]["template"]["spec"]["securityContext"].get("fsGroup")
            assert mode & 0o004 or (fs_group is not None and mode & 0o040), (
                f"{name}: {file} (mode {mode:o}) is unreadable for uid 1000"
            )
            assert not mode & 0o222, f"{name}: {file} is writable"


# ---- the overlay


def test_tls_overlay_is_rendered_and_validated_with_the_others():
    # test_k8s.py's checks (schemas at every version, flags, compose, ports, probes, security)
    # are parametrized over OVERLAYS: cpu-tls must be among them.
    assert TLS_OVERLAY in OVERLAYS and TLS_OVERLAY in TLS_OVERLAYS
    assert PLAIN_TWIN in OVERLAYS and PLAIN_TWIN not in TLS_OVERLAYS


def test_every_deployment_takes_its_roles_secret_read_only_for_all_three_flags():
    assert_mutual_tls(deployments_of(render(TLS_OVERLAY)))


def test_the_component_changes_only_tls_and_the_schedulers_probes():
    plain, tls = render(PLAIN_TWIN), render(TLS_OVERLAY)
    assert [(o["kind"], o["metadata"]["name"]) for o in plain] == [
        (o["kind"], o["metadata"]["name"]) for o in tls
    ]
    for before, after in zip(plain, tls, strict=True):
        if after["kind"] != "Deployment":
            assert after == before, f"{after['kind']}/{after['metadata']['name']}"
            continue
        name = after["metadata"]["name"]
        stripped = without_tls(after)
        if name == SCHEDULER_DEPLOYMENT:
            for probe in ("readinessProbe", "livenessProbe"):
                assert "grpc" in container(before)[probe]
                container(stripped)[probe] = container(before)[probe]
        assert stripped == before, f"{name}: the component changed more than TLS"


def test_scheduler_probes_are_tcp_on_its_grpc_port():
    # The kubelet's grpc probe is plaintext (no client certificate): the scheduler, which
    # requires one, would fail it in the handshake, never be ready and be restarted forever.
    sched = deployments_of(render(TLS_OVERLAY))[SCHEDULER_DEPLOYMENT]
    port = int(env_values(sched)["KVLEDGER_GRPC_PORT"])
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        spec = container(sched).get(probe)
        if spec is None:
            continue
        assert "grpc" not in spec, f"scheduler {probe}"
        assert named_port(sched, spec["tcpSocket"]["port"]) == port, f"scheduler {probe}"


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_the_plain_overlays_stay_plaintext(overlay):
    for name, dep in deployments_of(render(overlay)).items():
        assert not set(env_entries(dep)) & set(TLS_FILES), f"{name}: TLS is the component's"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_component_on_the_gpu_overlay_renders_and_validates(tmp_path, version):
    objs = render_with_component(tmp_path, "gpu")
    assert_mutual_tls(deployments_of(objs))
    for obj in objs:
        if obj["kind"] in ("ServiceMonitor", "PrometheusRule"):
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} ({version}): {err.message}")


# ---- no secret value committed


def test_no_key_or_certificate_is_in_the_manifests():
    for overlay in TLS_OVERLAYS:
        assert "Secret" not in {o["kind"] for o in render(overlay)}, "the operator's Secrets"
        text = yaml.safe_dump_all(render(overlay))
        for marker in PEM_MARKERS:
            assert marker not in text, f"overlays/{overlay} renders {marker!r}"
    for path in sorted(K8S.rglob("*")):
        if path.is_file():
            text = path.read_text()
            for marker in PEM_MARKERS:
                assert marker not in text, f"{path.relative_to(REPO)} holds {marker!r}"
            for doc in yaml.safe_load_all(text):
                assert not (doc and doc.get("kind") == "Secret"), path.relative_to(REPO)


# ---- the cert-manager example issues what the component mounts


def test_cert_manager_example_issues_exactly_the_mounted_secrets():
    certs = certificates()
    ca = [c for c in certs.values() if c["spec"].get("isCA")]
    assert len(ca) == 1, "one private CA"
    [ca_cert] = ca
    leaf = {n: c for n, c in certs.items() if not c["spec"].get("isCA")}
    assert {c["spec"]["secretName"] for c in leaf.values()} == set(ROLE_SECRET.values())
    assert ca_cert["spec"]["secretName"] not in ROLE_SECRET.values(), "no pod holds the CA key"
    [ca_issuer] = [i for i in issuers().values() if "ca" in i["spec"]]
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_cert["spec"]["secretName"]
    for name, cert in leaf.items():
        ref = cert["spec"]["issuerRef"]
        assert (ref["kind"], ref["name"]) == ("Issuer", ca_issuer["metadata"]["name"]), name


def test_scheduler_certificate_names_the_host_clients_dial_and_clients_can_authenticate():
    deps = deployments_of(render(TLS_OVERLAY))
    by_secret = {c["spec"]["secretName"]: c["spec"] for c in certificates().values()}
    sched = by_secret[ROLE_SECRET[SCHEDULER_DEPLOYMENT]]
    assert "server auth" in sched["usages"]
    for name, dep in deps.items():
        service = service_of(dep)
        spec = by_secret[ROLE_SECRET[name]]
        if service == SCHEDULER:
            continue
        assert service in (FRONTEND, WORKER)
        host = env_values(dep)["KVLEDGER_SCHEDULER"].rsplit(":", 1)[0]
        assert host in sched["dnsNames"], f"{name} dials {host}: not in the certificate"
        assert "client auth" in spec["usages"], f"{name}: mutual TLS needs a client certificate"


# ---- the docs


def test_operations_md_says_how_to_create_the_secrets_and_add_the_component():
    docs = (REPO / "docs" / "operations.md").read_text()
    assert "components/grpc-tls" in docs and "overlays/cpu-tls" in docs
    assert "components/grpc-tls/cert-manager.yaml" in docs
    for secret in sorted(set(ROLE_SECRET.values())):
        assert secret in docs, f"operations.md: how to create {secret}"
    assert "--type=kubernetes.io/tls" in docs
    for key in TLS_FILES.values():
        assert f"--from-file={key}=" in docs, f"operations.md: the Secret's {key}"

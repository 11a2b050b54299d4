"""docker-compose.yml: valid offline, and every service's command, env and ports agree with the
services' own flags (kvledger/flags.py), the healthchecks and deploy/prometheus/prometheus.yml."""

from __future__ import annotations

import pytest
import yaml

from kvledger.flags import FRONTEND, SCHEDULER, WORKER, flags_for
from tests.deploy.compose import (
    NON_FLAG_ENV,
    active_services,
    compose_argv,
    compose_env,
    container_ports,
    host_port,
    kv_services,
    parse_service,
    resolved,
)
from tests.deploy.defaults import restated_defaults
from tests.deploy.prom import scrape_targets
from tests.deploy.tools import REPO, run

PROFILES = [None, "gpu"]
PUBLISHED = {"frontend", "prometheus", "grafana"}
TRUE_FALSE = {"true", "false"}


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_config_is_valid(profile):
    proc = run(compose_argv("config", "-q", profile=profile), env=compose_env(), cwd=REPO)
    assert proc.returncode == 0, f"docker-compose config -q failed:\n{proc.stderr}"


def test_profiles_default_cpu_stack_and_gpu_worker():
    default, gpu = kv_services(None), kv_services("gpu")
    assert {s.service for s in default.values()} == {FRONTEND, SCHEDULER, WORKER}
    assert set(gpu) - set(default) == {"worker-gpu"}
    assert {"prometheus", "grafana"} <= set(active_services(None))
    cuda = resolved("gpu")["services"]["worker-gpu"]
    devices = cuda["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    assert cuda["build"]["dockerfile"] == "deploy/Dockerfile.cuda"


@pytest.mark.parametrize("profile", PROFILES)
def test_environment_is_made_of_the_services_own_flags(profile):
    for svc in kv_services(profile).values():
        flags = {f.env_var: f for f in flags_for(svc.service)}
        for key, value in svc.env.items():
            if not key.startswith("KVLEDGER_") or key in NON_FLAG_ENV:
                continue
            assert key in flags, f"{svc.name}: {key} is no flag of the {svc.service}"
            flag = flags[key]
            if flag.kind in ("bool", "switch"):
                assert value.lower() in TRUE_FALSE, f"{svc.name}: {key}={value!r}"
            if flag.choices:
                assert value in flag.choices, f"{svc.name}: {key}={value!r}"
        args = parse_service(svc)  # fails on a bad int/float/choice or an unknown argument
        for key, value in svc.env.items():
            flag = flags.get(key)
            if flag is None:
                continue
            parsed = getattr(args, flag.dest)
            if flag.kind == "list":
                expected = value.replace(",", " ").split()
            elif flag.kind in ("bool", "switch"):
                expected = value.lower() == "true"
            else:
                expected = flag.type(value)
            assert parsed == expected, f"{svc.name}: command line overrides {key}"


def _by_service(profile):
    services = kv_services(profile)
    args = {name: parse_service(svc) for name, svc in services.items()}
    return services, args


@pytest.mark.parametrize("profile", PROFILES)
def test_addresses_ports_and_healthchecks_agree(profile):
    services, args = _by_service(profile)
    [sched] = [n for n, s in services.items() if s.service == SCHEDULER]
    assert args[sched].grpc_host == "0.0.0.0", "the scheduler must bind beyond loopback"
    for name, svc in services.items():
        a = args[name]
        port, path = svc.health_url()
        if svc.service == FRONTEND:
            assert a.host == "0.0.0.0"
            assert (port, path) == (a.port, "/health")
            assert container_ports(svc.spec) == [a.port], "its metrics port is not published"
            assert a.metrics_port is not None and a.metrics_host == "0.0.0.0"
        else:
            assert (port, path) == (a.metrics_port, "/metrics"), name
            assert a.metrics_host == "0.0.0.0", f"{name}: Prometheus scrapes from its container"
            assert not svc.spec.get("ports"), f"{name} must not be published"
        if svc.service in (FRONTEND, WORKER):
            assert host_port(a.scheduler) == (sched, args[sched].grpc_port), name
        if svc.service == WORKER:
            assert a.worker_auth_token == args[sched].worker_auth_token, name


@pytest.mark.parametrize("profile", PROFILES)
def test_prometheus_scrapes_every_service_and_only_them(profile):
    services, args = _by_service(profile)
    # every service at its metrics port, the frontend's too (no API key needed there)
    expected = {(name, args[name].metrics_port) for name in services}
    listed = {t for targets in scrape_targets().values() for t in targets}
    assert expected <= listed, f"not scraped: {expected - listed}"
    every = {(n, 0) for n in kv_services("gpu")}
    assert {n for n, _ in listed} <= {n for n, _ in every}, "scrape target of no service"
    if profile == "gpu":
        assert listed == expected


def test_metrics_ports_are_unique_so_the_stack_can_also_run_on_one_host():
    services, args = _by_service("gpu")
    ports = [args[n].metrics_port for n in services]
    ports += [args[n].port for n, s in services.items() if s.service == FRONTEND]
    assert len(ports) == len(set(ports))


@pytest.mark.parametrize("profile", PROFILES)
def test_frontend_requires_exactly_the_default_workers_models(profile):
    services, args = _by_service(profile)
    default_models = {
        args[n].served_model_name or args[n].model
        for n, s in kv_services(None).items()
        if s.service == WORKER
    }
    assert "all-MiniLM-L6-v2" in default_models, "the embedding worker serves MiniLM"
    [front] = [n for n, s in services.items() if s.service == FRONTEND]
    assert set(args[front].require_model) == default_models


@pytest.mark.parametrize("profile", PROFILES)
def test_only_frontend_prometheus_grafana_are_published(profile):
    services = active_services(profile)
    assert {n for n, s in services.items() if s.get("ports")} == PUBLISHED
    networks = resolved(profile)["networks"]
    assert networks["internal"].get("internal") is True
    for name, svc in kv_services(profile).items():
        if svc.service != FRONTEND:
            assert set(svc.spec["networks"]) == {"internal"}, name
    for name in ("prometheus", "grafana"):
        host_ip = [str(p).split(":")[0] for p in services[name]["ports"]]
        assert host_ip == ["127.0.0.1"], f"{name} is published on loopback only"


@pytest.mark.parametrize("profile", PROFILES)
def test_depends_on_waits_for_healthy_services_with_start_periods(profile):
    services = active_services(profile)
    for name, svc in services.items():
        health = svc.get("healthcheck")
        assert health and health.get("start_period"), f"{name}: healthcheck with start_period"
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on {dep}, not started in this profile"
            assert cond["condition"] == "service_healthy", f"{name} -> {dep}"


def test_workers_share_the_models_volume_with_the_frontend():
    for name, svc in kv_services("gpu").items():
        if svc.service == SCHEDULER:
            continue
        volumes = [str(v) for v in svc.spec.get("volumes", [])]
        assert any(v.startswith("models:/models") for v in volumes), name
    assert "models" in resolved(None)["volumes"]
    dockerfile = (REPO / "deploy" / "Dockerfile.cpu").read_text()
    assert "KVLEDGER_CACHE_DIR=/models/" in dockerfile


@pytest.mark.parametrize("profile", PROFILES)
def test_configuration_is_all_in_the_environment(profile):
    for name, svc in kv_services(profile).items():
        assert svc.argv == [], f"{name}: put flags in KVLEDGER_* variables, not the command"


@pytest.mark.parametrize("profile", PROFILES)
def test_no_variable_restates_its_flags_default(profile):
    """Set only what differs from the default (tests/deploy/defaults.py says why). A value
    passed through from the operator's shell (`KVLEDGER_LOG_LEVEL: ${KVLEDGER_LOG_LEVEL:-info}`)
    is their setting, listed in docs/operations.md, not a pin."""
    raw = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    for name, svc in kv_services(profile).items():
        own = {
            k: v
            for k, v in svc.env.items()
            if not str(raw[name]["environment"].get(k, "")).startswith("${" + k)
        }
        restated = restated_defaults(svc.service, own)
        assert restated == [], f"{name} restates the default of {restated}"

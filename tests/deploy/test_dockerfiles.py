"""The Dockerfiles in deploy/: non-root, dependencies before sources, flash-attn in the CUDA one,
a CPU runtime stage without a compiler, and hadolint clean. These read the files; the CPU and
Prometheus images are built and run by test_compose_live.py (the CUDA image only here: no
CUDA base image or GPU where the tests run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.compose import resolved
from tests.deploy.tools import REPO

DOCKERFILES = ["deploy/Dockerfile.cpu", "deploy/Dockerfile.cuda"]  # the kvledger images
PROMETHEUS = "deploy/Dockerfile.prometheus"


def instructions(path: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / path).read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage(path: str) -> list[tuple[str, str]]:
    steps = instructions(path)
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_compose_builds_only_these_dockerfiles():
    built = {
        str((Path(s["build"]["context"]) / s["build"]["dockerfile"]).relative_to(REPO))
        for s in resolved("gpu")["services"].values()
        if "build" in s
    }
    assert built == {*DOCKERFILES, PROMETHEUS}


@pytest.mark.parametrize("path", DOCKERFILES)
def test_runs_as_uid_1000_not_root(path):
    stage = final_stage(path)
    users = [args for word, args in stage if word == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert any(word == "RUN" and "--uid 1000" in args for word, args in stage), (
        "uid 1000 in every image: they share the models volume"
    )


@pytest.mark.parametrize("path", DOCKERFILES)
def test_dependencies_are_installed_before_sources_are_copied(path):
    steps = instructions(path)
    first_source = min(
        i
        for i, (word, args) in enumerate(steps)
        if word == "COPY" and args.split()[0] in ("kvledger", ".", "worker")
    )
    deps = [
        i
        for i, (word, args) in enumerate(steps)
        if word == "RUN" and re.search(r"pip install ([^-]*\.|.* -r /tmp/deps\.txt)", args)
    ]
    assert deps and deps[0] < first_source
    assert not any(word == "COPY" and args.split()[0] == "." for word, args in steps)


@pytest.mark.parametrize("path", DOCKERFILES)
def test_model_cache_is_on_the_models_volume(path):
    envs = " ".join(args for word, args in final_stage(path) if word == "ENV")
    assert "KVLEDGER_CACHE_DIR=/models/cache" in envs


def test_cuda_image_installs_flash_attn_and_a_cuda_torch():
    steps = instructions("deploy/Dockerfile.cuda")
    runs = " ".join(args for word, args in steps if word == "RUN")
    assert re.search(r"pip install \"?flash-attn", runs)
    assert "--no-build-isolation" in runs
    assert any(word == "FROM" and "nvidia/cuda" in args for word, args in steps)


def test_cpu_image_builds_kernels_then_runs_without_a_compiler():
    steps = instructions("deploy/Dockerfile.cpu")
    froms = [args for word, args in steps if word == "FROM"]
    assert froms == ["${BASE} AS build", "${BASE}"], "multi-stage, both on the BASE argument"
    build_runs = " ".join(args for word, args in steps[: steps.index(("FROM", "${BASE}"))])
    assert "g++" in build_runs and "python -m worker.build_kernels" in build_runs
    final = final_stage("deploy/Dockerfile.cpu")
    runs = " ".join(args for word, args in final if word == "RUN")
    assert "g++" not in runs and "KVLEDGER_PREBUILT_KERNELS=" in " ".join(
        args for word, args in final if word == "ENV"
    )
    assert any(word == "HEALTHCHECK" for word, _ in final)
    assert any(word == "LABEL" and "org.opencontainers.image" in args for word, args in final)


def test_wheelhouse_mode_uses_no_index():
    text = (REPO / "deploy" / "Dockerfile.cpu").read_text()
    assert "--no-index --find-links /wheels" in text
    assert "COPY deploy/requirements.py build/wheel[s] /wheels/" in text, "index mode: none"


@pytest.mark.parametrize("path", [*DOCKERFILES, PROMETHEUS])
def test_hadolint_is_clean(path):
    hadolint = Path(sys.executable).parent / "hadolint"
    proc = subprocess.run(
        [str(hadolint), "--config", str(REPO / ".hadolint.yaml"), str(REPO / path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

"""The Dockerfiles in deploy/: non-root, dependencies before sources, flash-attn in the CUDA one.
(No Docker engine here: these read the files; nothing is built.)"""

from __future__ import annotations

import re

import pytest

from tests.deploy.compose import resolved
from tests.deploy.tools import REPO

DOCKERFILES = ["deploy/Dockerfile.cpu", "deploy/Dockerfile.cuda"]


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
    built = {s["build"]["dockerfile"] for s in resolved("gpu")["services"].values() if "build" in s}
    assert built == set(DOCKERFILES)


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
        if word == "RUN" and re.search(r"pip install [^-]*\.", args)
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

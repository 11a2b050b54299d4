"""Fixtures of the end-to-end tests: the shared stacks (tests/e2e/stacks.py) and their clients,
and the processes a test spawns itself."""

from __future__ import annotations

import subprocess

import httpx
import openai
import pytest

from kvledger.models import resolve_model
from tests.e2e.stacks import Stack, StackKeeper


@pytest.fixture
def processes():
    """Processes a test starts (tests.e2e.helpers.spawn); killed when it ends."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.fixture(scope="module")
def model_dir() -> str:
    """tiny-llama's directory (tokenizer, template), for stand-in workers (stand_in.py) to name."""
    return str(resolve_model("tiny-llama"))


@pytest.fixture(scope="package")
def stacks(tmp_path_factory):
    """The keeper of the shared stacks; the last one stops when the e2e tests end."""
    keeper = StackKeeper(lambda: tmp_path_factory.mktemp("stack"))
    yield keeper
    keeper.stop()


@pytest.fixture(scope="module", autouse=True)
def _one_stack_at_a_time(request, stacks):
    """A module that does not name the running stack stops it before its first test."""
    stacks.keep_only(getattr(request.module, "STACK", None))


def _stack_of(request) -> Stack:  # noqa: ANN001
    stack = getattr(request.module, "STACK", None)
    assert isinstance(stack, Stack), f"{request.module.__name__} names no STACK = Stack(...)"
    return stack


@pytest.fixture(scope="module")
def served(request, stacks):
    """The live stack the module names (its STACK)."""
    return stacks.get(_stack_of(request))


@pytest.fixture(scope="module")
def client(request, served):
    """The official openai client, sending the stack's API key."""
    key = _stack_of(request).api_key or "unused"
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def http(request, served):
    """A plain HTTP client, sending the stack's API key (generous timeout for a 2-core CI)."""
    key = _stack_of(request).api_key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=served.url, headers=headers, timeout=120) as c:
        yield c

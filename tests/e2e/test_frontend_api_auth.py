"""The OpenAI surface over a live stack started with two API keys: every state route needs a
key, health and version do not, and each key is a tenant whose prompts never share cached
blocks with another's (completions and chat alike)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.stacks import FRONTEND_API, KEY_A, KEY_B, MODEL

STACK = FRONTEND_API  # test_frontend_api.py's: running already when this module runs after it


GUARDED = [
    ("GET", "/v1/models", None),
    ("GET", "/metrics", None),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1}),
    (
        "POST",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
    ),
    ("GET", f"/v1/models/{MODEL}", None),
    ("POST", "/v1/embeddings", {"model": MODEL, "input": "x"}),
    ("POST", "/tokenize", {"model": MODEL, "prompt": "x"}),
    ("POST", "/detokenize", {"model": MODEL, "tokens": [101]}),
    ("GET", "/tokenizer_info", None),
]


@pytest.mark.parametrize(("method", "path", "body"), GUARDED)
def test_every_state_route_needs_a_key(served, method, path, body):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY_A}):
        reply = httpx.request(method, served.url + path, json=body, headers=headers)
        assert reply.status_code == 401, (path, headers)
        assert reply.json()["error"]["code"] == "invalid_api_key"
    reply = httpx.request(
        method,
        served.url + path,
        json=body,
        headers={"Authorization": f"Bearer {KEY_B}"},
        timeout=60,
    )
    assert reply.status_code != 401


def test_health_and_version_are_public(served):
    assert httpx.get(served.url + "/health").status_code == 200
    assert httpx.get(served.url + "/version").status_code == 200


def test_openai_client_raises_authentication_error(served):
    bad = openai.OpenAI(base_url=f"{served.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=MODEL, prompt="x", max_tokens=1)


def test_tenants_do_not_share_cache_but_a_tenant_does(served, client):
    other = openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY_B, max_retries=0)
    prompt = "tenant isolation test prompt " * 6
    salt = {"cache_salt": "shared-salt"}
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, extra_body=salt)
    b = other.completions.create(model=MODEL, prompt=prompt, max_tokens=1, extra_body=salt)
    assert b.usage.prompt_tokens_details.cached_tokens == 0
    a = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, extra_body=salt)
    assert a.usage.prompt_tokens_details.cached_tokens > 0
    unsalted = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert unsalted.usage.prompt_tokens_details.cached_tokens == 0


def test_chat_is_salted_per_tenant_too(served, client):
    other = openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY_B, max_retries=0)
    messages = [{"role": "user", "content": "tenant isolation of chat turns " * 6}]
    client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    b = other.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert b.usage.prompt_tokens_details.cached_tokens == 0
    a = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert a.usage.prompt_tokens_details.cached_tokens > 0

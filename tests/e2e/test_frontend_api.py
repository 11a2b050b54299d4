"""The OpenAI surface over a live stack started with API keys: auth, tenants, limits, stops,
disconnects, and a fuzz run that must never produce a 5xx."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import httpx
import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.errors import install_error_handlers
from tests.e2e.helpers import idle
from tests.serving import descendants, metric_sum, scrape, start_serve

KEY_A, KEY_B = "key-tenant-a", "key-tenant-b"
MODEL = "tiny-llama"
LONG_PROMPT = "a ledger of blocks, exact and counted, " * 8


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    served = start_serve(
        tmp_path_factory.mktemp("api"),
        "--num-kv-blocks",
        "128",
        "--api-key",
        KEY_A,
        "--api-key",
        KEY_B,
        "--max-n",
        "4",
    )
    yield served
    served.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY_A, max_retries=0)


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(
        base_url=served.url, headers={"Authorization": f"Bearer {KEY_A}"}, timeout=60
    ) as c:
        yield c


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


def test_prompt_forms_and_n(client):
    tok = client.completions.create(
        model=MODEL, prompt=[101, 2023, 2003], max_tokens=3, temperature=0
    )
    assert tok.usage.prompt_tokens == 3
    multi = client.completions.create(
        model=MODEL, prompt=["one", "two words"], max_tokens=2, temperature=0, n=2
    )
    assert [c.index for c in multi.choices] == [0, 1, 2, 3]
    assert multi.choices[0].text == multi.choices[1].text, "greedy choices agree"
    lists = client.completions.create(
        model=MODEL, prompt=[[101, 2000], [101, 2001, 2002]], max_tokens=1
    )
    assert len(lists.choices) == 2 and lists.usage.prompt_tokens == 5


def test_echo_prepends_the_prompt(client):
    out = client.completions.create(
        model=MODEL, prompt="hello there", max_tokens=3, echo=True, temperature=0
    )
    assert out.choices[0].text.startswith("hello there")


def test_stop_string_cuts_the_text_streaming_and_not(client):
    base = client.completions.create(
        model=MODEL,
        prompt=LONG_PROMPT,
        max_tokens=20,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    text = base.choices[0].text
    assert len(text) > 6
    stop = text[3:7]  # likely spans a token boundary
    cut = client.completions.create(
        model=MODEL,
        prompt=LONG_PROMPT,
        max_tokens=20,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    )
    assert cut.choices[0].text == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=LONG_PROMPT,
            max_tokens=20,
            temperature=0,
            stop=stop,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == cut.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 5}, "n"),
        ({"stop": ["x"] * 17}, "stop"),
        ({"stop": ["y" * 300]}, "stop"),
        ({"logprobs": 21}, "logprobs"),
        ({"temperature": 3}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"model": 5}, "model"),
        ({"best_of": 3}, "best_of"),  # accepted and ignored before
        ({"suffix": " and then"}, "suffix"),
        ({"prompt": [True, False]}, "prompt"),  # read as token ids 1 and 0 before
        ({"prompt": [1.5]}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
    ],
)
def test_invalid_values_are_400_in_openai_shape(http, served, body, param):
    payload = {"model": MODEL, "prompt": "x", "max_tokens": 2} | body
    reply = http.post("/v1/completions", json=payload)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert param in (error["param"] or "") or param in error["message"]
    assert idle(served)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": {"a": 1}}, "prompt"),
        ({"prompt": [1, "x"]}, "prompt"),
        ({"stop": [1]}, "stop"),
        ({"stream_options": {"include_usage": "zz"}}, "stream_options.include_usage"),
    ],
)
def test_param_names_the_field_not_pydantics_union_member(http, body, param):
    payload = {"model": MODEL, "prompt": "x", "max_tokens": 2} | body
    reply = http.post("/v1/completions", json=payload)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_prompt_filling_the_context_without_max_tokens_is_400(http):
    reply = http.post(
        "/v1/completions", json={"model": MODEL, "prompt": "word " * 2100, "max_tokens": None}
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "context_length_exceeded"


def test_unknown_fields_are_ignored(http):
    reply = http.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "x",
            "max_tokens": 1,
            "best_of": 1,
            "some_future_field": {"a": 1},
        },
    )
    assert reply.status_code == 200


def test_body_too_large_is_413_declared_or_chunked(http):
    big = b"{" + b" " * (5 * 1024 * 1024) + b"}"
    reply = http.post("/v1/completions", content=big, headers={"Content-Type": "application/json"})
    assert reply.status_code == 413

    def chunks():
        for i in range(0, len(big), 1 << 20):
            yield big[i : i + (1 << 20)]

    reply = http.post(
        "/v1/completions", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert reply.status_code == 413
    assert reply.json()["error"]["message"].startswith("the request body is larger")


LONE_SURROGATE = "\ud800"  # JSON may escape one; it is no Unicode text


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "a" + LONE_SURROGATE, "max_tokens": 1}, "prompt"),
        ("/v1/completions", {"prompt": ["ok", LONE_SURROGATE], "max_tokens": 1}, "prompt"),
        ("/v1/completions", {"model": LONE_SURROGATE, "prompt": "x"}, "model"),
        ("/v1/completions", {"prompt": "x", "cache_salt": LONE_SURROGATE}, "cache_salt"),
        ("/v1/completions", {"prompt": "x", "stop": [LONE_SURROGATE]}, "stop"),
        ("/v1/embeddings", {"input": LONE_SURROGATE}, "input"),
        ("/tokenize", {"prompt": "a" + LONE_SURROGATE}, "prompt"),
        ("/detokenize", {"model": LONE_SURROGATE, "tokens": [101]}, "model"),
    ],
)
def test_lone_surrogates_are_400_not_500(http, served, path, body, param):
    """A lone surrogate in a prompt, model name or cache salt made the tokenizer, the error body
    or the salt's hash raise: a plain-text 500 (the schema fuzz now sends such strings)."""
    payload = json.dumps({"model": MODEL} | body)  # json.dumps writes the escape "\ud800"
    reply = http.post(path, content=payload, headers={"Content-Type": "application/json"})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert "surrogate" in error["message"]
    assert idle(served)


@pytest.mark.parametrize(("method", "path"), [("TRACE", "/health"), ("DELETE", "/v1/completions")])
def test_wrong_method_is_405_with_allow_as_a_client_error(served, method, path):
    """Found by the schema fuzz: a 405 lost its Allow header and was typed as a server error."""
    reply = httpx.request(method, served.url + path)
    assert reply.status_code == 405
    assert reply.headers["allow"] == ("GET" if path == "/health" else "POST")
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"


def test_malformed_json_names_no_param(http):
    """The error used to carry the character offset as its param ("param": "10")."""
    reply = http.post(
        "/v1/completions", content=b'{"model": ', headers={"Content-Type": "application/json"}
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] is None and error["type"] == "invalid_request_error"
    assert "not valid JSON" in error["message"]


def test_errors_name_the_endpoints_own_fields(http):
    """An empty embeddings input was reported as param "prompt", and a completion too long for
    the context as "messages": neither endpoint has such a field."""
    reply = http.post("/v1/embeddings", json={"model": MODEL, "input": ""})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "input"
    reply = http.post(
        "/v1/completions", json={"model": MODEL, "prompt": "word " * 2100, "max_tokens": None}
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "context_length_exceeded"
    assert reply.json()["error"]["param"] == "prompt"


def test_an_unexpected_exception_is_an_openai_shaped_500():
    """Any bug left is still answered in OpenAI's shape (Starlette's default is plain text)."""
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    reply = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert reply.status_code == 500
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "server_error" and "a bug" not in error["message"]


def test_tokenize_roundtrip(http):
    ids = http.post("/tokenize", json={"model": MODEL, "prompt": "hello world"}).json()
    assert ids["count"] == len(ids["tokens"]) >= 2
    text = http.post("/detokenize", json={"model": MODEL, "tokens": ids["tokens"]}).json()
    assert "hello world" in text["prompt"]
    assert http.post("/detokenize", json={"model": MODEL, "tokens": [10**7]}).status_code == 400


def _raw_request(served, body: dict, path: str = "/v1/completions") -> socket.socket:
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", served.port))
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json".encode()
        + b"\r\nAuthorization: Bearer "
        + KEY_A.encode()
        + f"\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_releases_blocks_and_tracker(served, stream, chat):
    body = {"model": MODEL, "max_tokens": 1500, "ignore_eos": True, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": LONG_PROMPT}]
        sock = _raw_request(served, body, "/v1/chat/completions")
    else:
        sock = _raw_request(served, {**body, "prompt": LONG_PROMPT})
    deadline = time.monotonic() + 10
    while metric_sum(scrape(served.scheduler_metrics_url), "kvledger_kv_blocks_in_use") == 0:
        assert time.monotonic() < deadline, "request never started"
        time.sleep(0.02)
    sock.close()
    assert idle(served, timeout=1.0), "blocks or tracker entries outlived the client"


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=10,
)
FIELDS = [
    "temperature",
    "top_p",
    "n",
    "stream",
    "logprobs",
    "echo",
    "stop",
    "seed",
    "top_k",
    "min_p",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "cache_salt",
    "priority",
    "stream_options",
    "skip_special_tokens",
    "logit_bias",
    "add_special_tokens",
]


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.fixed_dictionaries(
        {
            "model": st.just(MODEL),
            "max_tokens": st.integers(-2, 4),
            "prompt": st.text(max_size=30) | JSON_VALUES,
        },
        optional={name: JSON_VALUES for name in FIELDS},
    )
)
def test_fuzz_completions_never_5xx(http, body):
    reply = http.post("/v1/completions", content=json.dumps(body))
    assert reply.status_code < 500, (body, reply.text)


PARTS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image_url"]) | JSON_VALUES},
        optional={"text": st.text(max_size=20) | JSON_VALUES},
    ),
    max_size=3,
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool"]) | JSON_VALUES},
        optional={"content": st.text(max_size=30) | PARTS | JSON_VALUES},
    ),
    max_size=4,
)
CHAT_FIELDS = [
    *FIELDS,
    "max_completion_tokens",
    "top_logprobs",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "response_format",
    "tools",
]


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.fixed_dictionaries(
        {
            "model": st.just(MODEL),
            "max_tokens": st.integers(-2, 4),
            "messages": MESSAGES | JSON_VALUES,
        },
        optional={name: JSON_VALUES for name in CHAT_FIELDS},
    )
)
def test_fuzz_chat_never_5xx(http, body):
    reply = http.post("/v1/chat/completions", content=json.dumps(body))
    assert reply.status_code < 500, (body, reply.text)


def test_server_still_serves_after_fuzz(client, served):
    out = client.completions.create(model=MODEL, prompt="still alive", max_tokens=2)
    assert out.choices
    assert idle(served)


def test_n_choices_share_the_prompt_blocks(client):
    prompt = "choices share one prompt's blocks in the ledger " * 5
    out = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=2,
        n=3,
        temperature=0,
        extra_body={"cache_salt": "n-test"},
    )
    assert len(out.choices) == 3
    # The first choice computes the prompt; the others hit its full blocks.
    assert out.usage.prompt_tokens_details.cached_tokens >= 16


def test_n_choices_with_a_seed_differ_and_the_response_repeats(client):
    kwargs = dict(
        model=MODEL,
        prompt="seeded choices",
        max_tokens=12,
        temperature=1.0,
        seed=1234,
        extra_body={"ignore_eos": True},
    )
    texts = [c.text for c in client.completions.create(n=3, **kwargs).choices]
    assert len(set(texts)) == 3, texts  # each choice draws its own sample (seed + index)
    again = [c.text for c in client.completions.create(n=3, **kwargs).choices]
    assert again == texts
    assert client.completions.create(n=1, **kwargs).choices[0].text == texts[0]


def test_multibyte_text_streams_exactly_as_it_completes(client):
    prompt = "東京 🎉 café naïve — 漢字 and emoji 😀 "
    kwargs = dict(
        model=MODEL,
        prompt=prompt,
        max_tokens=24,
        temperature=0,
        echo=True,
        extra_body={"ignore_eos": True},
    )
    full = client.completions.create(**kwargs).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True))
    assert streamed == full
    assert "\ufffd" not in full


@pytest.mark.parametrize(
    ("prompt", "says"),
    [([-1], "greater than or equal to 0"), ([1.5], "valid integer"), ([True], "valid integer")],
)
def test_a_bad_token_id_is_named_as_such(http, prompt, says):
    """Not pydantic's first union member ("Input should be a valid string")."""
    reply = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt})
    assert reply.status_code == 400
    assert says in reply.json()["error"]["message"], reply.text


def _frontend_pid(served) -> int:  # noqa: ANN001
    for pid in descendants(served.process.pid):
        argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        if argv[1:3] == ["-m", "server"]:
            return pid
    raise AssertionError("no frontend process")


def _peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def test_four_maximum_size_prompts_at_once_cost_the_frontend_little(served):
    """A text that cannot fit the context is refused before it is tokenized (a 4 MB prompt
    took the frontend from 432 MB to 1.3 GB; four at once to 4.2 GB)."""
    pid = _frontend_pid(served)
    before = _peak_rss_mib(pid)
    prompt = "ledger " * 570_000  # ~4 MB, under the 4 MiB body limit

    async def four() -> list[httpx.Response]:
        headers = {"Authorization": f"Bearer {KEY_A}"}
        async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=120) as c:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
            return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(4)))

    replies = asyncio.run(four())
    for reply in replies:
        assert reply.status_code == 400, reply.text[:300]
        assert reply.json()["error"]["code"] == "context_length_exceeded"
    assert _peak_rss_mib(pid) - before < 1024

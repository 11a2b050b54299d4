"""Bad requests against a live stack: each is a 4xx in OpenAI's error shape naming the field at
fault (never pydantic's internals), bodies over the limit are 413, and an unexpected exception
is an OpenAI-shaped 500."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from server.errors import install_error_handlers
from tests.e2e.helpers import idle
from tests.e2e.stacks import FRONTEND_API, MODEL

STACK = FRONTEND_API  # test_frontend_api.py's: running already when this module runs after it


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


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("TRACE", "/health", "GET"),
        ("DELETE", "/v1/completions", "POST"),
        ("PUT", "/v1/responses/resp_x", "GET, DELETE"),  # two routes at one path
    ],
)
def test_wrong_method_is_405_with_allow_as_a_client_error(served, method, path, allow):
    """Found by the schema fuzz: a 405 lost its Allow header and was typed as a server error;
    a path served by two routes lists both's methods (Starlette's names the first's)."""
    reply = httpx.request(method, served.url + path)
    assert reply.status_code == 405
    assert reply.headers["allow"] == allow
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


@pytest.mark.parametrize(
    ("prompt", "says"),
    [([-1], "greater than or equal to 0"), ([1.5], "valid integer"), ([True], "valid integer")],
)
def test_a_bad_token_id_is_named_as_such(http, prompt, says):
    """Not pydantic's first union member ("Input should be a valid string")."""
    reply = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt})
    assert reply.status_code == 400
    assert says in reply.json()["error"]["message"], reply.text


@pytest.mark.parametrize("path", ["/v1/batches", "/v1/messages/batches", "/v1/audio/speech"])
def test_an_unserved_route_is_a_404_naming_it(http, path):
    """Clients of other APIs got a bare "Not Found": the 404 names the path and what is served."""
    reply = http.post(path, json={})
    assert reply.status_code == 404
    error = reply.json()["error"]
    assert path in error["message"] and "/v1/chat/completions" in error["message"]
    assert error["type"] == "not_found_error"

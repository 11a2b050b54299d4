"""Bodies parsed off the event loop (server/body_offload.py): the same values and the same
errors as FastAPI's own parsing, lists counted before validation, and a body nested past
Python's recursion limit, or not UTF-8, a 400 saying so."""

from __future__ import annotations

import json

import pytest
from fastapi.exceptions import RequestValidationError

from kvledger.config.frontend import Limits
from server.body_offload import SMALL_BODY_BYTES, parsed
from server.chat_protocol import ChatCompletionRequest
from server.errors import APIError
from server.protocol import CompletionRequest, DetokenizeRequest

LIMITS = Limits()


@pytest.mark.parametrize("size", [10, SMALL_BODY_BYTES + 10])
def test_small_and_large_bodies_parse_to_the_same_model(size):
    body = {"model": "m", "prompt": "x" * size, "stop": ["a", "b"], "logit_bias": {"3": 1.5}}
    raw = json.dumps(body).encode()
    assert parsed(CompletionRequest, raw, LIMITS) == CompletionRequest.model_validate(body)
    padded = json.dumps({**body, "prompt": "p", "pad": [[1, {"a": None}]] * size}).encode()
    assert parsed(CompletionRequest, padded, LIMITS).prompt == "p"


def test_errors_are_fastapis():
    with pytest.raises(RequestValidationError) as invalid:
        parsed(CompletionRequest, b'{"model": "m", "prompt": "x", "n": 0}', LIMITS)
    assert invalid.value.errors()[0]["loc"] == ("body", "n")
    with pytest.raises(RequestValidationError) as broken:
        parsed(CompletionRequest, b'{"model": "m",', LIMITS)
    assert broken.value.errors()[0]["type"] == "json_invalid"


@pytest.mark.parametrize("size", [10_000, SMALL_BODY_BYTES])
def test_deep_nesting_and_bad_utf8_are_400s(size):
    deep = b'{"model": "m", "prompt": "x", "x": ' + b"[" * size + b"]" * size + b"}"
    with pytest.raises(APIError, match="nested too deeply") as refused:
        parsed(CompletionRequest, deep, LIMITS)
    assert refused.value.status == 400
    with pytest.raises(APIError, match="UTF-8"):
        parsed(CompletionRequest, b'{"model": "\xff\xfe\xfd"' + b" " * size + b"}", LIMITS)


@pytest.mark.parametrize(
    ("model", "body", "param"),
    [
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": ""}] * 1025}, "messages"),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": [{"type": "text"}] * 1025}]},
            "messages",
        ),
        (CompletionRequest, {"prompt": "x", "stop_token_ids": [1] * 65}, "stop_token_ids"),
        (
            CompletionRequest,
            {"prompt": "x", "logit_bias": {str(i): 1 for i in range(1025)}},
            "logit_bias",
        ),
        (CompletionRequest, {"prompt": [[1] * 1024] * 65}, "prompt"),
        (DetokenizeRequest, {"tokens": [1] * 65537}, "tokens"),
    ],
)
def test_lists_are_counted_before_validation(model, body, param):
    with pytest.raises(APIError) as refused:
        parsed(model, json.dumps({"model": "m", **body}).encode(), LIMITS)
    assert (refused.value.status, refused.value.param) == (400, param)

"""Request parameters against a live `kvledger serve` (tiny-llama, decode steps bundled four at
a time): those not implemented are refused by name (their no-op values pass), and those
implemented do what they say: include_stop_str_in_output, and min_tokens masking EOS across
bundled steps."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import refused
from tests.e2e.stacks import BOUNDS, MODEL, SEP

STACK = BOUNDS  # test_bounds.py's: running already when this module runs after it


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
NOT_SERVED = [
    ("use_beam_search", True),
    ("prompt_logprobs", 1),
    ("best_of", 3),
    ("logits_processors", ["x"]),
]
CHAT_ONLY = [
    ("echo", True),
    ("chat_template", "{{ messages }}"),
]


@pytest.mark.parametrize(("name", "value"), NOT_SERVED)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_parameters_not_implemented_are_refused_by_name(http, path, name, value):
    base = CHAT if path.endswith("chat/completions") else COMPLETION
    refused(http.post(path, json={**base, name: value}), name)


# Structured outputs need a tokenizer with fixed token bytes; tiny-llama's is WordPiece.
STRUCTURED = [
    ("guided_json", {"type": "object"}),
    ("guided_choice", ["a", "b"]),
    ("guided_regex", "a+"),
    ("structured_outputs", {"json": {}}),
    ("response_format", {"type": "json_object"}),
]


@pytest.mark.parametrize(("name", "value"), STRUCTURED)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_structured_outputs_on_a_wordpiece_model_are_refused_by_name(http, path, name, value):
    base = CHAT if path.endswith("chat/completions") else COMPLETION
    refused(http.post(path, json={**base, name: value}), name, "not available for this model")


def test_a_structured_spec_past_its_bound_is_refused(http):
    reply = http.post("/v1/completions", json={**COMPLETION, "guided_regex": "a" * 70_000})
    refused(reply, "guided_regex", "at most 65536 characters")


@pytest.mark.parametrize(("name", "value"), CHAT_ONLY)
def test_chat_parameters_not_implemented_are_refused_by_name(http, name, value):
    refused(http.post("/v1/chat/completions", json={**CHAT, name: value}), name)


def test_no_op_values_of_unimplemented_parameters_pass(http):
    noop = {"use_beam_search": False, "best_of": 1, "guided_json": None, "echo": False}
    assert http.post("/v1/chat/completions", json={**CHAT, **noop}).status_code == 200


def test_priority_without_the_priority_policy_is_refused(http):
    reply = http.post("/v1/completions", json={**COMPLETION, "priority": 1})
    assert reply.status_code == 400
    assert "--scheduling-policy priority" in reply.json()["error"]["message"]
    assert http.post("/v1/completions", json={**COMPLETION, "priority": 0}).status_code == 200


def test_include_stop_str_in_output_keeps_the_stop_string(http):
    body = {**COMPLETION, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    text = http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    stop = next(word for word in text.split()[1:] if len(word) >= 3)
    cut = http.post("/v1/completions", json={**body, "stop": stop}).json()["choices"][0]
    kept = http.post(
        "/v1/completions", json={**body, "stop": stop, "include_stop_str_in_output": True}
    ).json()["choices"][0]
    assert cut["text"] == text[: text.index(stop)]
    assert kept["text"] == text[: text.index(stop) + len(stop)]
    assert cut["finish_reason"] == kept["finish_reason"] == "stop"


def test_min_tokens_masks_eos_until_reached_in_bundled_steps(http):
    """EOS all but forced (logit_bias +100), min_tokens 6, four decode steps per bundle: the
    first six tokens are never EOS (before, EOS was sampled and shown, only not a stop)."""
    body = {
        **COMPLETION,
        "max_tokens": 12,
        "min_tokens": 6,
        "temperature": 0,
        "logit_bias": {str(SEP): 100},
        "logprobs": 0,
        "skip_special_tokens": False,
    }
    reply = http.post("/v1/completions", json=body).json()
    choice = reply["choices"][0]
    tokens = choice["logprobs"]["tokens"]
    assert "[SEP]" not in tokens[:6], tokens
    assert choice["finish_reason"] == "stop"
    assert reply["usage"]["completion_tokens"] == 7  # six masked, then EOS
    chat = {
        **CHAT,
        "max_tokens": 12,
        "min_tokens": 6,
        "temperature": 0,
        "logit_bias": {str(SEP): 100},
    }
    assert http.post("/v1/chat/completions", json=chat).json()["usage"]["completion_tokens"] == 7

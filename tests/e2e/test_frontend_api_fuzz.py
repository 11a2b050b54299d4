"""Fuzzed completion and chat bodies (hypothesis) against a live stack: never a 5xx, and the
server still serves afterwards."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.helpers import idle
from tests.e2e.stacks import FRONTEND_API, MODEL

STACK = FRONTEND_API  # test_frontend_api.py's: running already when this module runs after it


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

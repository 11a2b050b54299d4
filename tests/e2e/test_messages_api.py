"""Anthropic's /v1/messages on a live stack (`kvledger serve`, tiny-llama, two API keys) through
the official `anthropic` client: create and stream, a conversation carrying a tool_use and its
tool_result, count_tokens, the key as `x-api-key`, errors the client raises by their class; and
after it all no block or tracker entry left. Replies and calls on a scripted model:
test_messages_in_process.py."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.e2e.helpers import idle
from tests.e2e.stacks import FRONTEND_API, KEY_A, MODEL

STACK = FRONTEND_API  # test_frontend_api.py's: running already when this module runs after it
ASK = [{"role": "user", "content": "hello there"}]
# long enough to fill blocks of the prefix cache
LONG = [{"role": "user", "content": "tell me about the ledger of the cache " * 4}]
TOOL = {
    "name": "lookup",
    "description": "Looks a word up.",
    "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}},
}
CONVERSATION = [
    *ASK,
    {"role": "assistant", "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_01", "name": "lookup", "input": {"word": "hello"}},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "a greeting"},
        {"type": "text", "text": "and so?"},
    ]},
]  # fmt: skip


@pytest.fixture(scope="module")
def claude(served):
    """The anthropic client, sending KEY_A as its x-api-key."""
    return anthropic.Anthropic(base_url=served.url, api_key=KEY_A, max_retries=0, timeout=120)


def test_create_and_stream(claude):
    created = claude.messages.create(
        model=MODEL, max_tokens=6, messages=LONG, system=[{"type": "text", "text": "Be kind."}],
        extra_body={"temperature": 0.0},
    )  # fmt: skip
    assert created.id.startswith("msg_") and created.role == "assistant"
    assert created.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= created.usage.output_tokens <= 6
    with claude.messages.stream(
        model=MODEL, max_tokens=6, messages=LONG, system=[{"type": "text", "text": "Be kind."}],
        extra_body={"temperature": 0.0},
    ) as stream:  # fmt: skip
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "".join(b.text for b in created.content if b.type == "text")  # greedy
    assert final.usage.output_tokens == created.usage.output_tokens
    assert final.usage.cache_read_input_tokens > 0  # the same prompt again, from the cache


def test_a_tool_use_and_its_tool_result_round_trip(claude):
    reply = claude.messages.create(
        model=MODEL, max_tokens=4, messages=CONVERSATION, tools=[TOOL],
        tool_choice={"type": "auto"},
    )  # fmt: skip
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    counted = claude.messages.count_tokens(model=MODEL, messages=CONVERSATION, tools=[TOOL])
    plain = claude.messages.count_tokens(model=MODEL, messages=ASK)
    assert counted.input_tokens > plain.input_tokens
    usage = reply.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == counted.input_tokens


def test_errors_come_as_the_clients_exceptions(claude, served):
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="no-such-model", max_tokens=2, messages=ASK)
    with pytest.raises(anthropic.BadRequestError) as caught:  # tiny-llama: WordPiece, no grammar
        claude.messages.create(
            model=MODEL, max_tokens=8, messages=ASK, tools=[TOOL], tool_choice={"type": "any"}
        )
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    image = {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}
    with pytest.raises(anthropic.BadRequestError, match="`image` blocks"):
        claude.messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [image]}]
        )
    wrong = anthropic.Anthropic(base_url=served.url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=MODEL, max_tokens=2, messages=ASK)


def test_raw_http_shapes_and_quiescence(served):
    body = {"model": MODEL, "max_tokens": 3, "messages": ASK, "stream": True}
    headers = {"x-api-key": KEY_A, "anthropic-version": "2023-06-01"}
    streamed = httpx.post(f"{served.url}/v1/messages", json=body, headers=headers, timeout=60)
    assert streamed.status_code == 200
    names = [line[7:] for line in streamed.text.splitlines() if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    if "content_block_start" in names:
        assert names[names.index("content_block_start") + 1] == "ping"
    for bad in ({**body, "top_p": 2}, {**body, "unknown": 1}, {**body, "messages": []}):
        reply = httpx.post(f"{served.url}/v1/messages", json=bad, headers=headers)
        assert reply.status_code == 400
        assert reply.json()["error"]["type"] == "invalid_request_error"
    missing = httpx.post(f"{served.url}/v1/messages", json=body)
    assert missing.status_code == 401 and missing.json()["type"] == "error"
    assert idle(served), "blocks, tracker entries or requests outlived the requests"

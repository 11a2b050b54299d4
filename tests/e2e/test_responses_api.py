"""OpenAI's /v1/responses on a live stack (`kvledger serve`, tiny-llama, two API keys) through
the official `openai` client: create and stream (greedy: the same text), a conversation
continued by previous_response_id with its prefix from the cache, function_call and
function_call_output items as input, retrieve, input_items and delete, another key's
responses out of sight, errors the client raises by their class; and after it all no block or
tracker entry left. Replies and calls on a scripted model, and a frontend restarted over the
same database: test_responses_in_process.py."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.helpers import idle
from tests.e2e.stacks import FRONTEND_API, KEY_A, KEY_B, MODEL

STACK = FRONTEND_API  # test_frontend_api.py's: running already when this module runs after it
LONG = "tell me about the ledger of the cache " * 4  # long enough to fill blocks
LOOKUP = {
    "type": "function",
    "name": "lookup",
    "description": "Looks a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def clients(served):
    """The openai client for each of the two keys."""
    return tuple(
        openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=0, timeout=120)
        for key in (KEY_A, KEY_B)
    )


def test_create_stream_and_continue(clients):
    a, _ = clients
    first = a.responses.create(
        model=MODEL, input=LONG, instructions="Be kind.", max_output_tokens=6, temperature=0.0
    )
    assert first.id.startswith("resp_") and first.status in ("completed", "incomplete")
    assert 1 <= first.usage.output_tokens <= 6
    stream = a.responses.create(
        model=MODEL, input=LONG, instructions="Be kind.", max_output_tokens=6, temperature=0.0,
        stream=True,
    )  # fmt: skip
    events = list(stream)
    assert events[0].type == "response.created" and events[-1].type.startswith("response.")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == first.output_text  # greedy
    final = events[-1].response
    assert final.usage.input_tokens_details.cached_tokens > 0  # the same prompt again
    later = a.responses.create(
        model=MODEL, input="and then?", previous_response_id=final.id,
        instructions="Be kind.", max_output_tokens=4, temperature=0.0,
    )  # fmt: skip
    assert later.previous_response_id == final.id
    assert later.usage.input_tokens > final.usage.input_tokens + final.usage.output_tokens
    assert later.usage.input_tokens_details.cached_tokens >= final.usage.input_tokens // 16 * 16


def test_function_calls_and_their_outputs_as_input(clients):
    a, _ = clients
    turns = [
        {"role": "user", "content": "hello there"},
        {"type": "function_call", "call_id": "call_1", "name": "lookup",
         "arguments": '{"word": "hello"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "a greeting"},
    ]  # fmt: skip
    reply = a.responses.create(
        model=MODEL, input=turns, tools=[LOOKUP], max_output_tokens=4, store=False
    )
    assert reply.store is False and reply.status in ("completed", "incomplete")
    with pytest.raises(openai.NotFoundError):  # store: false kept nothing
        a.responses.retrieve(reply.id)


def test_read_list_delete_and_keep_apart(clients):
    a, b = clients
    made = a.responses.create(model=MODEL, input="hello there", max_output_tokens=3)
    assert a.responses.retrieve(made.id).output_text == made.output_text
    (item,) = a.responses.input_items.list(made.id).data
    assert item.type == "message" and item.role == "user"
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(made.id)
    with pytest.raises(openai.BadRequestError, match="not found"):
        b.responses.create(model=MODEL, input="more", previous_response_id=made.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.delete(made.id)
    a.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(made.id)


def test_errors_come_as_the_clients_exceptions(clients, served):
    a, _ = clients
    with pytest.raises(openai.NotFoundError):
        a.responses.create(model="no-such-model", input="hi")
    with pytest.raises(openai.BadRequestError, match="`input_image` content parts"):
        image = {"type": "input_image", "image_url": "http://x/y.png"}
        a.responses.create(model=MODEL, input=[{"role": "user", "content": [image]}])
    with pytest.raises(openai.BadRequestError, match="`web_search` tools"):
        a.responses.create(model=MODEL, input="hi", tools=[{"type": "web_search"}])
    wrong = openai.OpenAI(base_url=f"{served.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.responses.create(model=MODEL, input="hi")
    missing = httpx.get(f"{served.url}/v1/responses/resp_x")
    assert missing.status_code == 401
    assert idle(served), "blocks, tracker entries or requests outlived the requests"

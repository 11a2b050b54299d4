"""/v1/chat/completions over a live stack, through the official `openai` client: the response
and chunk shapes, n with a seed, logprobs in the chat shape, usage in a stream, a multi-turn
conversation reusing its earlier turns' cache, and every parameter refused with a 400."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.helpers import idle
from tests.e2e.stacks import Stack

KEY = "key-chat"
MODEL, EMBEDDING_MODEL = "tiny-llama", "all-MiniLM-L6-v2"
SYSTEM = "You keep an exact ledger of every block, counted and checked at every step. " * 3
MESSAGES = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "What does the scheduler know about a block?"},
]


STACK = Stack(("--num-kv-blocks", "256", "--api-key", KEY, "--max-n", "4"), embedding=True)


def greedy(**kw) -> dict:  # noqa: ANN003
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "temperature": 0} | kw


def test_chat_completion_equals_the_completion_of_the_templated_prompt(client, http):
    chat = client.chat.completions.create(**greedy(extra_body={"ignore_eos": True}))
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-")
    (choice,) = chat.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert choice.logprobs is None
    prompt = http.post("/tokenize", json={"model": MODEL, "messages": MESSAGES}).json()
    assert (
        prompt["tokens"][0] == 101 and prompt["tokens"].count(101) == 1
    )  # one BOS: the template's
    plain = client.completions.create(
        model=MODEL, prompt=prompt["tokens"], max_tokens=8, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert choice.message.content == plain.choices[0].text
    usage = chat.usage
    assert usage.prompt_tokens == prompt["count"] and usage.completion_tokens == 8
    assert usage.total_tokens == usage.prompt_tokens + 8
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_streaming_sends_the_role_then_content_then_the_finish_then_usage(client):
    whole = client.chat.completions.create(**greedy(extra_body={"ignore_eos": True}))
    chunks = list(
        client.chat.completions.create(
            **greedy(
                stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}
            )  # fmt: skip
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    *body, finish, usage = chunks
    assert finish.choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in body)
    content = "".join(c.choices[0].delta.content or "" for c in body)
    assert content == whole.choices[0].message.content
    assert usage.choices == [] and usage.usage.completion_tokens == 8
    assert all(c.usage is None for c in chunks[:-1])
    plain = list(client.chat.completions.create(**greedy(stream=True)))
    assert all(c.usage is None for c in plain)


def test_n_with_a_seed_differs_per_choice_and_repeats(client):
    def ask():  # noqa: ANN202
        return client.chat.completions.create(
            **greedy(n=2, seed=11, temperature=1.0, max_tokens=12, extra_body={"ignore_eos": True})
        )

    first, again = ask(), ask()
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1]
    assert texts[0] != texts[1]
    assert [c.message.content for c in again.choices] == texts


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_in_the_chat_shape(client, stream):
    request = greedy(logprobs=True, top_logprobs=3, stream=stream, extra_body={"ignore_eos": True})
    if stream:
        entries = [
            e
            for c in client.chat.completions.create(**request)
            if c.choices and c.choices[0].logprobs is not None
            for e in c.choices[0].logprobs.content
        ]
    else:
        entries = client.chat.completions.create(**request).choices[0].logprobs.content
    assert len(entries) == 8
    for entry in entries:
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 3
        best = entry.top_logprobs[0]
        assert best.token == entry.token and best.logprob == pytest.approx(entry.logprob)  # greedy
        assert all(t.bytes == list(t.token.encode()) for t in entry.top_logprobs)


@pytest.mark.parametrize("top", [None, 0, 20])
def test_top_logprobs_range_from_0_to_20_and_the_entry_shape(http, top):
    """Without top_logprobs, or with 0, each entry's alternatives are an empty list; with 20,
    twenty; each entry is exactly OpenAI's (`token`, `logprob`, `bytes`, `top_logprobs`)."""
    body = greedy(max_tokens=3, logprobs=True, ignore_eos=True)
    if top is not None:
        body["top_logprobs"] = top
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    entries = reply.json()["choices"][0]["logprobs"]["content"]
    assert len(entries) == 3
    for entry in entries:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert len(entry["top_logprobs"]) == (top or 0)
        assert all(set(t) == {"token", "logprob", "bytes"} for t in entry["top_logprobs"])


def test_a_second_turn_reuses_the_first_turns_blocks(client):
    first = client.chat.completions.create(**greedy(max_tokens=6))
    answer = first.choices[0].message.content
    turn2 = [*MESSAGES, {"role": "assistant", "content": answer},
             {"role": "user", "content": "And when it is evicted?"}]  # fmt: skip
    second = client.chat.completions.create(model=MODEL, messages=turn2, max_tokens=4)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 16  # every full block of the first prompt
    assert 0 < cached < second.usage.prompt_tokens


def test_stop_strings_and_max_completion_tokens(client):
    base = client.chat.completions.create(**greedy(max_tokens=16, extra_body={"ignore_eos": True}))
    text = base.choices[0].message.content
    stop = text[4:7]
    cut = client.chat.completions.create(
        **greedy(max_tokens=16, stop=[stop], extra_body={"ignore_eos": True})
    )
    assert cut.choices[0].message.content == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    three = client.chat.completions.create(
        **greedy(max_tokens=None, max_completion_tokens=3, extra_body={"ignore_eos": True})
    )
    assert three.usage.completion_tokens == 3
    # OpenAI's newer name wins over the older one when a client sends both (as vLLM reads them)
    both = client.chat.completions.create(
        **greedy(max_tokens=8, max_completion_tokens=2, extra_body={"ignore_eos": True})
    )
    assert both.usage.completion_tokens == 2


def test_response_format_text_is_accepted(client):
    """`text` is free text; the JSON formats are constrained decoding, which tiny-llama's
    WordPiece tokenizer cannot serve (refused below; served on SmolLM2:
    tests/e2e/test_structured_outputs.py)."""
    out = client.chat.completions.create(**greedy(max_tokens=2, response_format={"type": "text"}))
    assert out.choices[0].finish_reason in ("stop", "length")


REFUSED = [
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools.0.function.name"),
    ({"tool_choice": "auto"}, "tool_choice"),
    # tiny-llama's WordPiece tokenizer cannot be constrained: no forced call
    (
        {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"},
        "tools",
    ),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"model": EMBEDDING_MODEL}, "model"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"logit_bias": {"not-an-id": 1}}, "logit_bias"),
    ({"logit_bias": {"101": 101}}, "logit_bias"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.tool_call_id"),
    ({"messages": [{"role": "narrator", "content": "x"}]}, "messages.0.role"),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
        "messages.0.content",
    ),  # fmt: skip
    ({"add_generation_prompt": True, "continue_final_message": True}, "continue_final_message"),
    ({"max_tokens": 4000}, "messages"),
    ({"n": 5}, "n"),
]


@pytest.mark.parametrize(("extra", "param"), REFUSED)
def test_refused_with_a_400_naming_the_parameter(client, http, extra, param):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2} | extra
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "Traceback" not in error["message"]
    rest = {k: v for k, v in body.items() if k not in ("model", "messages")}
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=body["model"], messages=body["messages"], extra_body=rest
        )


def test_continue_final_message_continues_the_assistant(client, http):
    messages = [*MESSAGES, {"role": "assistant", "content": "The ledger"}]
    options = {"add_generation_prompt": False, "continue_final_message": True}
    out = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=2, extra_body=options
    )
    prompt = http.post("/tokenize", json={"model": MODEL, "messages": messages, **options}).json()
    assert out.usage.prompt_tokens == prompt["count"]
    assert prompt["tokens"][-1] != 102  # no [SEP] after the message being continued


def test_the_ledger_is_idle_afterwards(served):
    assert idle(served)

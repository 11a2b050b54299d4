"""Details of the OpenAI API that real clients (the openai client, LangChain, LiteLLM,
lm-eval-harness, vLLM's benchmark client) rely on, each found differing once: echo, logprobs
entries, logit_bias, model objects, add_special_tokens, stream_options, /tokenize."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.stacks import Stack

KEY = "key-details"
MODEL, EMBEDDING_MODEL = "tiny-llama", "all-MiniLM-L6-v2"
PROMPT = "Hello,   my NAME is"
IS = 2003  # "is" in tiny-llama's vocabulary


STACK = Stack(("--num-kv-blocks", "128", "--api-key", KEY), embedding=True)


@pytest.mark.parametrize("stream", [False, True])
def test_echo_returns_the_prompt_exactly_as_sent(client, stream):
    request = dict(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, echo=True,
                   logprobs=1, extra_body={"ignore_eos": True})  # fmt: skip
    plain = client.completions.create(**{**request, "echo": False, "logprobs": None})
    if stream:
        chunks = list(client.completions.create(**request, stream=True))
        text = "".join(c.choices[0].text for c in chunks)
        offsets = [o for c in chunks for o in c.choices[0].logprobs.text_offset]
    else:
        choice = client.completions.create(**request).choices[0]
        text, offsets = choice.text, choice.logprobs.text_offset
    assert text == PROMPT + plain.choices[0].text
    # [CLS] my/hello , my name is: each prompt token's offset indexes the exact prompt text
    prompt_offsets, output_offsets = offsets[:6], offsets[6:]
    assert prompt_offsets == [0, 0, 5, 9, 12, 17]
    assert output_offsets[0] == len(PROMPT) and output_offsets == sorted(output_offsets)


def test_echo_of_a_token_id_prompt_is_the_decoded_prompt(client):
    out = client.completions.create(
        model=MODEL, prompt=[101, 7592, 1010, 2026], max_tokens=2, temperature=0, echo=True
    )
    assert out.choices[0].text.startswith("[CLS] hello, my")
    # special tokens are echoed as they were sent, as vLLM echoes them
    pads = client.completions.create(
        model=MODEL, prompt=[0, 0, 0], max_tokens=1, temperature=0, echo=True
    )
    assert pads.choices[0].text.startswith("[PAD] [PAD] [PAD]")


def test_top_logprobs_include_the_sampled_token(client):
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, logprobs=2, seed=3)
    lp = out.choices[0].logprobs
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[token] == pytest.approx(logprob)
        assert 2 <= len(top) <= 3
    zero = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, logprobs=0)
    lp = zero.choices[0].logprobs
    assert lp.top_logprobs == [{t: v} for t, v in zip(lp.tokens, lp.token_logprobs, strict=True)]


def test_logit_bias_is_honoured_in_completions_and_chat(client, http):
    bias = {str(IS): 100}
    out = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=5, logprobs=0, logit_bias=bias,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert out.choices[0].logprobs.tokens == ["is"] * 5
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, logprobs=True,
        logit_bias=bias, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert [e.token for e in chat.choices[0].logprobs.content] == ["is"] * 4
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0)
    first = greedy.choices[0].text.strip()
    banned = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
        logit_bias={str(t): -100 for t in ids(http, first)},
    )  # fmt: skip
    assert banned.choices[0].text.strip() != first


def ids(http: httpx.Client, text: str) -> list[int]:
    body = {"model": MODEL, "prompt": text, "add_special_tokens": False}
    return http.post("/tokenize", json=body).json()["tokens"]


@pytest.mark.parametrize("bias", [{"x": 1}, {"-1": 1}, {"101": 100.5}, {"101": -101}, {"30522": 1}])
def test_a_bad_logit_bias_is_400(http, bias):
    for path, body in [
        ("/v1/completions", {"prompt": "x"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ]:
        reply = http.post(path, json={"model": MODEL, "logit_bias": bias, **body})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "logit_bias"


def test_model_objects(client, http):
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.root == MODEL and card.parent is None
    assert card.model_extra["max_model_len"] > 0
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    missing = http.get("/v1/models/no-such-model")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    listed = [m.id for m in client.models.list()]
    assert listed == [MODEL, EMBEDDING_MODEL]  # the generative model first
    assert all(m.root == m.id for m in client.models.list())


def test_add_special_tokens(client, http):
    with_bos = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
    without = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=1, extra_body={"add_special_tokens": False}
    )
    assert without.usage.prompt_tokens == with_bos.usage.prompt_tokens - 1
    messages = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    doubled = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=1, extra_body={"add_special_tokens": True}
    )
    # The template writes the BOS; add_special_tokens (chat's default: false) adds another.
    assert doubled.usage.prompt_tokens == chat.usage.prompt_tokens + 1
    tokens = http.post("/tokenize", json={"model": MODEL, "messages": messages}).json()
    assert tokens["count"] == chat.usage.prompt_tokens


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "x"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ],
)
def test_stream_options_without_stream_is_400(http, path, body):
    payload = {"model": MODEL, "stream_options": {"include_usage": True}, "max_tokens": 2, **body}
    reply = http.post(path, json=payload)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "stream_options"
    assert http.post(path, json={**payload, "stream": True}).status_code == 200


def test_tokenize_token_strs_and_messages(http):
    reply = http.post(
        "/tokenize", json={"model": MODEL, "prompt": PROMPT, "return_token_strs": True}
    ).json()
    assert reply["token_strs"] == ["[CLS]", "hello", ",", "my", "name", "is"]
    # always in the reply, null unless asked for (vLLM's shape)
    assert http.post("/tokenize", json={"model": MODEL, "prompt": "x"}).json()["token_strs"] is None
    chat = http.post(
        "/tokenize",
        json={"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
              "return_token_strs": True},
    ).json()  # fmt: skip
    assert chat["token_strs"][:3] == ["[CLS]", "user", ":"]
    assert chat["token_strs"][-3:] == ["[SEP]", "assistant", ":"]
    both = http.post("/tokenize", json={"model": MODEL, "prompt": "x", "messages": []})
    assert both.status_code == 400

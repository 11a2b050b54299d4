"""`kvledger serve` end to end: real processes, real gRPC and HTTP, the official openai client."""

from __future__ import annotations

import time
import urllib.request

import openai
import pytest

from tests.e2e.stacks import SERVE
from tests.serving import metric_sum, scrape

PROMPT = "The quick brown fox jumps over the lazy dog and"


STACK = SERVE


def wait_idle(served, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(served.scheduler_metrics_url)
        busy = (
            metric_sum(samples, "kvledger_kv_blocks_in_use")
            + metric_sum(samples, "kvledger_tracker_entries")
            + metric_sum(samples, "kvledger_num_requests_running")
            + metric_sum(samples, "kvledger_num_requests_waiting")
        )
        if busy == 0 or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def test_models_lists_tiny_llama(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-llama"]


def test_completion_shape_and_usage(client, served):
    out = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=12, temperature=0)
    assert out.object == "text_completion"
    assert out.model == "tiny-llama"
    assert len(out.choices) == 1
    choice = out.choices[0]
    assert choice.index == 0
    assert choice.finish_reason in ("length", "stop")
    assert isinstance(choice.text, str) and choice.text
    assert out.usage.prompt_tokens > 5
    assert 1 <= out.usage.completion_tokens <= 12
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    samples = wait_idle(served)
    assert metric_sum(samples, "kvledger_kv_blocks_in_use") == 0
    assert metric_sum(samples, "kvledger_tracker_entries") == 0


def test_streamed_text_equals_non_streamed(client):
    kwargs = dict(model="tiny-llama", prompt=PROMPT, max_tokens=24, temperature=0)
    full = client.completions.create(**kwargs, extra_body={"ignore_eos": True})
    chunks = list(client.completions.create(**kwargs, stream=True, extra_body={"ignore_eos": True}))
    assert all(c.object == "text_completion" for c in chunks)
    assert all(c.choices[0].text for c in chunks[:-1]), "no empty chunk before the last"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert full.usage.completion_tokens == 24


def test_stream_include_usage(client):
    chunks = list(
        client.completions.create(
            model="tiny-llama",
            prompt=PROMPT,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 5


def test_second_identical_prompt_hits_the_prefix_cache(client, served):
    prompt = PROMPT * 6  # several full blocks
    first = client.completions.create(
        model="tiny-llama", prompt=prompt, max_tokens=4, temperature=0
    )
    second = client.completions.create(
        model="tiny-llama", prompt=prompt, max_tokens=4, temperature=0
    )
    assert second.choices[0].text == first.choices[0].text
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 16 and cached % 16 == 0 and cached < second.usage.prompt_tokens


def test_bad_requests_get_openai_errors_and_leave_nothing(client, served):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=10**6)
    assert "maximum context length" in str(err.value)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=2, temperature=-1)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny-llama", prompt=[10**9], max_tokens=2)
    ok = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=2)
    assert ok.choices[0].text is not None
    samples = wait_idle(served)
    assert metric_sum(samples, "kvledger_kv_blocks_in_use") == 0


def test_health_and_version(served):
    with urllib.request.urlopen(f"{served.url}/health") as reply:
        assert reply.status == 200
    with urllib.request.urlopen(f"{served.url}/version") as reply:
        assert b"version" in reply.read()


def test_logprobs_streaming_and_not(client):
    kwargs = dict(
        model="tiny-llama",
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    out = client.completions.create(**kwargs)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert len(lp.text_offset) == 6 and lp.text_offset == sorted(lp.text_offset)
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert chosen <= 0 and len(top) <= 2
        assert abs(chosen - max(top.values())) < 1e-4, "greedy picks the most likely token"
    chunks = list(client.completions.create(**kwargs, stream=True))
    streamed = [
        t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.token_logprobs
    ]
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-5)


def test_seeded_sampling_repeats_and_penalties_are_accepted(client):
    kwargs = dict(
        model="tiny-llama",
        prompt=PROMPT,
        max_tokens=12,
        temperature=1.0,
        top_p=0.9,
        extra_body={"ignore_eos": True, "top_k": 50, "min_p": 0.01},
    )
    a = client.completions.create(**kwargs, seed=7)
    b = client.completions.create(**kwargs, seed=7)
    assert a.choices[0].text == b.choices[0].text
    c = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        presence_penalty=1.5,
        frequency_penalty=1.0,
        extra_body={"repetition_penalty": 1.3, "ignore_eos": True},
    )
    plain = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT,
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert c.choices[0].text != plain.choices[0].text, "penalties change the greedy path"


def test_streamed_logprobs_match_with_a_stop_string(client):
    kwargs = dict(
        model="tiny-llama",
        prompt=PROMPT,
        max_tokens=16,
        temperature=0,
        logprobs=1,
        extra_body={"ignore_eos": True},
    )
    text = client.completions.create(**kwargs).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 5]
    full = client.completions.create(**kwargs, stop=stop).choices[0]
    chunks = list(client.completions.create(**kwargs, stop=stop, stream=True))
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed == full.logprobs.tokens
    assert sum(1 for c in chunks if c.choices[0].finish_reason) == 1

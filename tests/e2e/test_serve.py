"""`kvledger serve` end to end: real processes, real gRPC and HTTP, the official openai client."""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass

import openai
import pytest
import torch

from tests.serving import alive, metric_sum, scrape, start_serve

PROMPT = "The quick brown fox jumps over the lazy dog and"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    served = start_serve(tmp_path_factory.mktemp("serve"), "--num-kv-blocks", "64")
    yield served
    served.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)


def wait_idle(served, timeout: float = 5.0) -> dict[str, float]:
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


def test_stop_leaves_no_process(tmp_path):
    served = start_serve(tmp_path, "--num-kv-blocks", "32")
    code = served.stop()
    assert code == 0, served.log()
    assert len(served.children) >= 3
    deadline = time.monotonic() + 5
    while any(alive(p) for p in served.children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in served.children if alive(p)]


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


@dataclass
class PromptReference:
    """On the same generated tiny-llama directory the server loads: the prompt's token ids,
    their texts, the prompt as echoed (exactly as sent), and transformers' log_softmax at each
    position."""

    ids: list[int]
    tokens: list[str]
    echo: str
    logprobs: torch.Tensor

    @classmethod
    def of(cls, prompt: str) -> PromptReference:
        from tokenizers import Tokenizer
        from transformers import AutoModelForCausalLM

        from kvledger.models import resolve_model

        path = resolve_model("tiny-llama")
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        ids = tokenizer.encode(prompt).ids
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        return cls(
            ids,
            [tokenizer.decode([t], skip_special_tokens=False) for t in ids],
            prompt,
            torch.log_softmax(logits, dim=-1),
        )


def test_echo_with_logprobs_scores_the_prompt_without_the_cache(client):
    prompt = PROMPT * 4  # several full blocks, so a cache hit would show
    kwargs = dict(
        model="tiny-llama",
        prompt=prompt,
        max_tokens=3,
        temperature=0,
        logprobs=2,
        echo=True,
        extra_body={"ignore_eos": True},
    )
    client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=1)  # caches it
    out = client.completions.create(**kwargs)
    ref = PromptReference.of(prompt)
    n = len(ref.ids)
    choice, lp = out.choices[0], out.choices[0].logprobs
    assert out.usage.prompt_tokens == n and out.usage.completion_tokens == 3
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n + 3
    assert len(lp.text_offset) == n + 3 and lp.tokens[:n] == ref.tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    want = ref.logprobs[torch.arange(n - 1), torch.tensor(ref.ids[1:])].tolist()
    assert lp.token_logprobs[1:n] == pytest.approx(want, abs=1e-4)
    for token, top, row in zip(
        lp.tokens[1:n], lp.top_logprobs[1:n], ref.logprobs[: n - 1], strict=True
    ):  # the 2 likeliest and the prompt's own token
        assert len(top) <= 3 and token in top
        assert max(top.values()) == pytest.approx(row.max().item(), abs=1e-4)
    # The last prompt position predicts the first generated token (greedy: the likeliest).
    assert lp.token_logprobs[n] == pytest.approx(ref.logprobs[n - 1].max().item(), abs=1e-4)
    # Offsets count from the start of the echoed text; the completion starts where it ends.
    assert choice.text.startswith(ref.echo) and lp.text_offset[n] == len(ref.echo)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    second = choice.text[lp.text_offset[1] : lp.text_offset[2]]
    assert second.strip().lower() == lp.tokens[1]  # the echo is the prompt as sent
    # Never served from the cache, not even on a repeat of a prompt the cache holds.
    assert out.usage.prompt_tokens_details.cached_tokens == 0
    again = client.completions.create(**kwargs)
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    assert again.choices[0].logprobs.token_logprobs[1:] == pytest.approx(
        lp.token_logprobs[1:], abs=1e-5
    )
    plain = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=1)
    assert plain.usage.prompt_tokens_details.cached_tokens >= 16, "the cache held the prompt"
    # Streaming gives the same entries, the prompt's with the echoed prompt.
    chunks = list(client.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert len(chunks[0].choices[0].logprobs.tokens) >= n
    streamed = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
    for column in ("tokens", "text_offset", "top_logprobs"):
        assert [x for s in streamed for x in getattr(s, column)] == getattr(lp, column)
    values = [x for s in streamed for x in s.token_logprobs]
    assert values[0] is None and values[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)


def test_echo_with_max_tokens_0_scores_the_prompt_alone(client):
    kwargs = dict(model="tiny-llama", prompt=PROMPT, temperature=0, logprobs=1, echo=True)
    generated = client.completions.create(**kwargs, max_tokens=2).choices[0]
    scored = generated.logprobs
    out = client.completions.create(**kwargs, max_tokens=0)
    choice, lp = out.choices[0], out.choices[0].logprobs
    n = out.usage.prompt_tokens
    assert out.usage.completion_tokens == 0 and choice.finish_reason == "length"
    assert len(lp.tokens) == n and lp.tokens == scored.tokens[:n]
    assert lp.text_offset == scored.text_offset[:n]
    assert lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(scored.token_logprobs[1:n], abs=1e-5)
    assert choice.text == generated.text[: scored.text_offset[n]], "the echoed prompt alone"
    chunks = list(client.completions.create(**kwargs, max_tokens=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert [
        t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens
    ] == lp.tokens
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=0)


def test_sigterm_during_startup_stops_everything(tmp_path):
    import signal
    import subprocess
    import sys

    from tests.serving import REPO, descendants, free_port

    cmd = [
        sys.executable,
        "-m",
        "kvledger.cli",
        "serve",
        "--port",
        str(free_port()),
        "--grpc-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
        "--model",
        "tiny-llama",
        "--embedding-model",
        "none",
        "--require-model",
        "never-served",
    ]
    process = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while len(descendants(process.pid)) < 3:
        assert time.monotonic() < deadline, "services never started"
        time.sleep(0.1)
    children = descendants(process.pid)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    time.sleep(0.5)
    assert not [p for p in children if alive(p)]

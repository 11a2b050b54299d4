"""`kvledger serve` scoring a prompt (`echo` with `logprobs`, as lm-eval-harness asks for
loglikelihoods): every prompt token's logprob, computed without the prefix cache, equal to
what the same tokens score when generated, streamed and not."""

from __future__ import annotations

from dataclasses import dataclass

import openai
import pytest
import torch

from tests.e2e.stacks import SERVE

STACK = SERVE  # test_serve.py's: running already when this module runs after it
PROMPT = "The quick brown fox jumps over the lazy dog and"


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

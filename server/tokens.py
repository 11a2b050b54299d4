"""Prompts to token ids, and token ids back to text, as every endpoint needs them."""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

from server.client import ServedModel
from server.detokenizer import IncrementalDetokenizer
from server.errors import APIError
from server.protocol import Prompt


@dataclass(frozen=True)
class Tokenized:
    """A prompt's token ids, and the text it is echoed as with, for each token, where its text
    starts in that text."""

    ids: list[int]
    text: str | None = None  # None: a token-id prompt, decoded only when echoed
    offsets: list[int] | None = None


def tokenize_prompts(
    prompt: Prompt, model: ServedModel, param: str = "prompt", add_special_tokens: bool = True
) -> list[Tokenized]:
    """Each prompt's tokens; `param` names the request's field in errors. A text prompt is
    echoed exactly as sent (the tokenizer's offsets index it, whatever its normalizer does); a
    token-id prompt is echoed as its decoded text."""
    if isinstance(prompt, str):
        texts: list[str] | None = [prompt]
    elif prompt and all(isinstance(p, str) for p in prompt):
        texts = list(prompt)  # type: ignore[arg-type]
    else:
        texts = None
    if texts is not None:
        if any(not t for t in texts):
            raise APIError(400, f"{param} must not be empty", param=param)
        check_text_fits(max(len(t) for t in texts), model, param)
        encodings = model.tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        prompts = [
            Tokenized(e.ids, t, [start for start, _ in e.offsets])
            for e, t in zip(encodings, texts, strict=True)
        ]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [Tokenized(list(prompt))]  # type: ignore[arg-type]
    else:
        prompts = [Tokenized(list(p)) for p in prompt]  # type: ignore[union-attr]
    if not prompts or any(len(p.ids) == 0 for p in prompts):
        raise APIError(400, f"{param} must not be empty", param=param)
    return prompts


def check_text_fits(num_chars: int, model: ServedModel, param: str) -> None:
    """Refuses, before tokenizing it, a text too long to fit the context whatever it says."""
    if num_chars > model.max_prompt_chars:
        raise APIError(
            400,
            f"This model's maximum context length is {model.info.max_model_len} tokens; "
            f"a text of {num_chars} characters cannot fit it. Please shorten it.",
            param=param,
            code="context_length_exceeded",
        )


def echoed(tokenizer: Tokenizer, prompt: Tokenized) -> Tokenized:
    """The prompt with its echo text: a token-id prompt is decoded token by token, as
    generated text is detokenized, so that offsets index the text. Its special tokens stay in
    the text (`[PAD] [PAD] ...`, as vLLM echoes them): the echo is the prompt as sent."""
    if prompt.text is not None:
        return prompt
    ids = prompt.ids
    detokenizer = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=False)
    text, offsets = "", []
    for token in ids:
        offsets.append(len(text))
        text += detokenizer.push([token])
    return Tokenized(ids, text + detokenizer.flush(), offsets)


def token_text(model: ServedModel, token: int) -> str:
    """One token's own text, special tokens included (logprobs name every token)."""
    return model.tokenizer.decode([token], skip_special_tokens=False)

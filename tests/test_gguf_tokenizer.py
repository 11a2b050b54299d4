"""The tokenizer the frontend builds from a GGUF file's metadata gives the ids transformers'
GGUF tokenizer gives (the packaged SmolLM2 file), and decoding gives the text back; what it
cannot build it refuses by name."""

from __future__ import annotations

import pytest

from kvledger.gguf_file import GGUFError
from kvledger.gguf_tokenizer import build, load_gguf_tokenizer
from kvledger.models import smollm2_path

TEXTS = [
    "Hello world",
    "  two leading spaces,\t\ttabs,\n\n\nnewlines and trailing spaces   ",
    "digits 1234567890, 3.14159 and 1,000,000",
    "emoji 😀👍🏽 🇫🇷 and a ZWJ family 👨‍👩‍👧",
    "accents: café naïve Ångström Zürich señor",
    "code:\ndef f(x):\n    return x ** 2  # square\n\tif x != 0: print(f'{x!r}')",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "中文 日本語 한국어 русский ελληνικά",
    "don't I'll we've THEY'RE",
    "a\u00a0b\u200bc",
    "",
    " ",
    "\n",
]


@pytest.fixture(scope="module")
def ours():
    return load_gguf_tokenizer(smollm2_path())


@pytest.fixture(scope="module")
def theirs():
    from transformers import AutoTokenizer

    path = smollm2_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def test_ids_equal_transformers_and_decode_round_trips(ours, theirs):
    for text in TEXTS:
        ids = ours.tokenizer.encode(text).ids
        assert ids == theirs.encode(text, add_special_tokens=True), text
        assert ours.tokenizer.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_and_chat_template(ours):
    ids = ours.tokenizer.encode("<|im_start|>assistant<|im_end|>").ids
    assert ids[0] == 1 and ids[-1] == 2  # matched whole, never split
    assert ours.special_tokens["bos_token"] == "<|im_start|>"
    assert ours.special_tokens["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in ours.chat_template
    assert ours.tokenizer.decode(ids, skip_special_tokens=True) == "assistant"


def test_add_bos_token_is_honoured():
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": ["<s>", "</s>", "a", "b", "ab"],
        "tokenizer.ggml.token_type": [3, 3, 1, 1, 1],
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": True,
    }
    assert build(meta, "x.gguf").tokenizer.encode("abab").ids == [0, 4, 4]
    meta["tokenizer.ggml.add_eos_token"] = True
    assert build(meta, "x.gguf").tokenizer.encode("ab").ids == [0, 4, 1]


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("tokenizer.ggml.model", "llama", "SentencePiece"),
        ("tokenizer.ggml.pre", "made-up", "made-up"),
    ],
)
def test_unsupported_tokenizers_are_refused_by_name(key, value, says):
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"], key: value}
    with pytest.raises(GGUFError, match=says) as err:
        build(meta, "x.gguf")
    assert "--tokenizer" in str(err.value)

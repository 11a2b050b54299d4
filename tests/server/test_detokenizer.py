"""Incremental detokenization: streamed pieces concatenate to the full decode."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from kvledger.models import embedding_model_path
from server.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(embedding_model_path() / "tokenizer.json"))


@pytest.mark.parametrize(
    "text",
    [
        "hello world, this is a test of incremental detokenization",
        "unbelievably long tokenization words split into pieces",
        "naïve café — 東京 and emoji 🎉 mixed",
    ],
)
def test_pieces_concatenate_to_the_whole(tokenizer, text):
    prompt = tokenizer.encode("the prompt says").ids
    out = tokenizer.encode(text, add_special_tokens=False).ids
    one_by_one = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [one_by_one.push([t]) for t in out] + [one_by_one.flush()]
    at_once = IncrementalDetokenizer(tokenizer, prompt)
    whole = at_once.push(out) + at_once.flush()
    assert "".join(pieces) == whole
    assert whole.strip() == tokenizer.decode(out).strip()


def test_never_emits_a_replacement_character_mid_stream():
    # A byte-level fallback tokenizer would split a character; simulate with a decode that
    # yields U+FFFD until the second half arrives.
    class HalfChar:
        def decode(self, ids, skip_special_tokens=True):
            text = "".join({1: "a", 2: "\ufffd", 3: ""}[i] for i in ids)
            return text.replace("\ufffd", "é") if 3 in ids else text

    detok = IncrementalDetokenizer(HalfChar(), [1])  # type: ignore[arg-type]
    assert detok.push([2]) == ""
    assert detok.push([3]) == "é"

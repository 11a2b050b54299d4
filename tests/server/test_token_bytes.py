"""Logprobs' `bytes` are each token's own bytes: concatenated, they give the text back, partial
UTF-8 characters included (a token holding half of `é` is not U+FFFD's bytes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kvledger.models import resolve_model
from server.token_bytes import TokenBytes

TEXT = "naïve café — 日本語 ünïcödé ok"


def byte_level() -> Tokenizer:
    """A small byte-level BPE (GPT-2's scheme, as SmolLM2's and Llama 3's): few merges, so
    multi-byte characters stay split across tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|im_end|>"],
    )
    tokenizer.train_from_iterator(["plain ascii text " * 20], trainer)
    return tokenizer


def byte_fallback() -> Tokenizer:
    """SentencePiece's byte fallback (Llama 2's scheme): unknown characters are `<0xNN>`."""
    vocab = {
        "<unk>": 0,
        **{f"<0x{b:02X}>": 1 + b for b in range(256)},
        "▁ok": 257,
        "a": 258,
        "▁": 259,
    }
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return tokenizer


@pytest.mark.parametrize("make", [byte_level, byte_fallback])
def test_bytes_concatenate_to_the_text(make):
    tokenizer = make()
    ids = tokenizer.encode(TEXT).ids
    reader = TokenBytes.of(tokenizer)
    pieces = [reader(t) for t in ids]
    # Some token holds part of a character: decoded alone it is U+FFFD.
    assert any(tokenizer.decode([t]) == "\ufffd" for t in ids)
    assert all(p != "\ufffd".encode() for p in pieces)
    joined = b"".join(pieces).decode()
    assert joined == tokenizer.decode(ids)
    assert joined.removeprefix(" ") == TEXT  # (Metaspace's leading space: no Strip here)


def test_special_and_whole_character_tokens_are_their_text():
    tokenizer = byte_level()
    special = tokenizer.token_to_id("<|im_end|>")
    assert TokenBytes.of(tokenizer)(special) == b"<|im_end|>"
    bert = Tokenizer.from_file(str(Path(resolve_model("tiny-llama")) / "tokenizer.json"))
    reader = TokenBytes.of(bert)
    for token in bert.encode("ledger [SEP]", add_special_tokens=False).ids:
        assert reader(token) == bert.decode([token], skip_special_tokens=False).encode()

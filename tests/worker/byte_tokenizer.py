"""A small byte-level BPE tokenizer for the grammar tests: a token per byte, `"` `:` and `{"`
merged, and `<eos>`."""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from server.token_bytes import byte_of_char

EOS = 258  # after the 256 byte tokens and two merges
VOCAB = 300  # wider than the tokenizer: ids 259.. name no token and are never allowed


def write_byte_tokenizer(out: Path) -> Path:
    """`out` holding the tokenizer's tokenizer.json."""
    char = {b: c for c, b in byte_of_char().items()}
    vocab = {char[b]: b for b in range(256)}
    merges = [(char[ord('"')], char[ord(":")]), (char[ord("{")], char[ord('"')])]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken("<eos>", special=True)])
    tokenizer.save(str(out / "tokenizer.json"))
    return out

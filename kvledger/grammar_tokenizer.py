"""The grammar engine's view of a model's tokenizer: which bytes each token id stands for.

llguidance builds it from the `tokenizers` library's JSON (byte-level BPE, SentencePiece with
byte fallback). A tokenizer whose tokens have no fixed bytes is refused by name: WordPiece's
decoder puts a space before a token or not depending on the token before it (tiny-llama's
BERT vocabulary), so a mask over token bytes would not constrain the decoded text. The frontend
and the worker build it from the same files (the model's, or `--tokenizer`'s directory), and
with the model's EOS ids: a grammar that is complete allows exactly those.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llguidance
from tokenizers import Tokenizer

from kvledger.gguf_file import is_gguf
from kvledger.structured import StructuredError


def load_tokenizer(source: str | Path, gguf_metadata: dict[str, Any] | None = None) -> Tokenizer:
    """The tokenizer of a model directory (its tokenizer.json) or of a GGUF file
    (`gguf_metadata`: that file's metadata, vocabulary included, when the caller has it)."""
    if gguf_metadata is not None:
        from kvledger.gguf_tokenizer import build

        tokenizer = build(gguf_metadata, str(source)).tokenizer
    elif is_gguf(source):
        from kvledger.gguf_tokenizer import load_gguf_tokenizer

        tokenizer = load_gguf_tokenizer(source).tokenizer
    else:
        tokenizer = Tokenizer.from_file(str(Path(source) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def grammar_tokenizer(
    tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Sequence[int]
) -> llguidance.LLTokenizer:
    """The engine's tokenizer over the model's whole vocabulary (`vocab_size`: the logits'
    width; ids the tokenizer does not name are never allowed); StructuredError when the
    engine cannot read this kind of tokenizer (slow for a large vocabulary: cache it;
    docs/performance.md, "Sampler and elementwise kernels")."""
    return grammar_tokenizer_of_json(tokenizer.to_str(), vocab_size, eos_token_ids)


def grammar_tokenizer_of_json(
    tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int]
) -> llguidance.LLTokenizer:
    """`grammar_tokenizer` of a tokenizer's JSON text (what a process without the tokenizer
    object is handed: the frontend's grammar sandbox)."""
    eos = list(eos_token_ids) or None
    try:
        return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=eos)
    except ValueError as err:
        raise StructuredError(
            f"structured outputs are not available for this model: its tokenizer cannot be "
            f"read by the grammar engine ({err}); a byte-level BPE or SentencePiece tokenizer "
            "is needed"
        ) from None


def build_grammar_tokenizer(
    source: str,
    vocab_size: int,
    eos_token_ids: Sequence[int],
    gguf_metadata: dict[str, Any] | None = None,
) -> llguidance.LLTokenizer | StructuredError:
    """`grammar_tokenizer` of the tokenizer at `source`, or the refusal every request on it
    would get (the caller keeps either: both are the same for every request). `gguf_metadata`:
    the metadata of the GGUF file at `source`, vocabulary included, when the caller parsed it
    already (a worker, for its weights)."""
    try:
        tokenizer = load_tokenizer(source, gguf_metadata)
    except Exception as err:  # OSError, GGUFError, or the tokenizers library's own Exception
        return StructuredError(f"the model's tokenizer cannot be loaded: {err}")
    try:
        return grammar_tokenizer(tokenizer, vocab_size, eos_token_ids)
    except StructuredError as err:
        return err

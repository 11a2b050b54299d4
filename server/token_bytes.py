"""Each token's own bytes, for logprobs' `bytes` field.

A token may hold part of a UTF-8 character (byte-level BPE splits `é` into two tokens; a
SentencePiece byte-fallback token is one byte). Decoded alone, such a token is U+FFFD, whose
bytes say nothing; OpenAI's `bytes` exists so that a client concatenating them gets the text
back, partial characters included. So the bytes are read from the token's vocabulary entry,
as the tokenizer's decoder would turn it into bytes:

- byte-level decoders (GPT-2, Llama 3, Qwen, SmolLM): each character of the entry stands for
  one byte (GPT-2's byte-to-unicode table);
- byte fallback (`<0xE2>` entries): that byte; other entries are UTF-8, with `▁` a space;
- anything else (WordPiece, ...): the token decoded alone, as UTF-8 (their tokens are whole
  characters). Added tokens (special or not) are their own text in every case.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache

from tokenizers import Tokenizer

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def byte_of_char() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the printable stand-in character -> its byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


@dataclass
class TokenBytes:
    tokenizer: Tokenizer
    decoders: frozenset[str]
    added: frozenset[int]
    _cache: dict[int, bytes] = field(default_factory=dict)

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> TokenBytes:
        decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
        kinds = {decoder.get("type", "")}
        kinds.update(d.get("type", "") for d in decoder.get("decoders") or [])
        added = frozenset(tokenizer.get_added_tokens_decoder())
        return cls(tokenizer, frozenset(kinds), added)

    def __call__(self, token: int) -> bytes:
        cached = self._cache.get(token)
        if cached is None:
            cached = self._cache[token] = self._read(token)
        return cached

    def _read(self, token: int) -> bytes:
        piece = self.tokenizer.id_to_token(token)
        if piece is None or token in self.added:
            return self.tokenizer.decode([token], skip_special_tokens=False).encode()
        if "ByteLevel" in self.decoders:
            table = byte_of_char()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        if "ByteFallback" in self.decoders:
            match = _BYTE_TOKEN.fullmatch(piece)
            if match:
                return bytes([int(match.group(1), 16)])
            return piece.replace("▁", " ").encode()
        return self.tokenizer.decode([token], skip_special_tokens=False).encode()
